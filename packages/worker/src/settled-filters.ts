/**
 * A thread's copies of its shards' settled marker filters, so the claim
 * script probes one bucket's filter instead of every live bucket's.
 *
 * Why: at steady state a claim probed three filters per digest (the bucket
 * of now and the two before it), and a probe is the dearest thing a claim
 * does in Redis: about 2 µs per digest and bucket, a third of the whole
 * claim (docs/benchmark.md, "Where the time goes"). Every script writes
 * markers into the bucket of now (marker_buckets.lua), so once the server's
 * clock has left a bucket its filter no longer changes: the thread reads it
 * once (the bucket's block and marker counts, then its words) and probes
 * it here, in JavaScript, for nothing. The script then reads the
 * marker hashes of such a bucket only for the digests this copy may hold.
 *
 * Exact, not trusting clocks: the script uses a copy only while the bucket
 * still has the block count and the marker count (meta `n`, which every
 * marker write raises) the copy was taken at. A clock set back by a failover
 * that writes into an old bucket raises `n`, and from then on the script
 * probes that bucket itself. A copy holds every bit of the filter at its
 * count, so a digest it rules out is one the server's filter rules out too.
 * SETTLE_GRACE_S after a bucket's end only spares copying a filter still
 * being written. Buckets without a filter (older formats) are not copied.
 *
 * Memory: the copies of the live settled buckets, at most MAX_COPY_BYTES per
 * thread (about 3 bytes per marker); past that a bucket is probed by the
 * script.
 */
import { filterSlotOf } from '@tally/shared';
import type { Redis } from 'ioredis';

/** Seconds past a bucket's end before its filter is copied (a bucket's width when that is shorter: tests). */
export const SETTLE_GRACE_S = 5;
/** Bytes of filter copies one thread keeps at most. */
export const MAX_COPY_BYTES = 256 * 1024 * 1024;

interface FilterCopy {
  /** 0: the bucket was empty (no meta hash) when copied; it may hold nothing while its marker count stays absent. */
  readonly blocks: number;
  /** The bucket's marker count (meta `n`) when copied; -1 when it had none. */
  readonly markers: number;
  readonly words: Buffer;
}

interface ShardCopies {
  /** bucket -> its copy, or null: the bucket has no filter, the script reads it. */
  readonly copies: Map<number, FilterCopy | null>;
  readonly loading: Set<number>;
  nowS: number;
}

/** What the claim script takes from the copies (claim_markers.lua ARGV[7], ARGV[8]). */
export interface VouchedBuckets {
  /** '' or 'bucket:blocks:markers' joined by ','. */
  readonly buckets: string;
  /** Per bucket in that order, one byte per digest: '1' where its copy may hold it ('' when no bucket is). */
  readonly flags: Buffer | '';
}

/** No bucket probed by the thread: the script probes every live bucket. */
export const NO_VOUCHED_BUCKETS: VouchedBuckets = Object.freeze({ buckets: '', flags: '' as const });

/** Whether a copied filter may hold the digest: all four of its bits set in its block (marker_buckets.lua mayHold). */
export function copyMayHold(copy: FilterCopy, digest: Uint8Array): boolean {
  if (copy.blocks === 0) return false;
  const { block, bits } = filterSlotOf(digest, copy.blocks);
  const at = block * 4;
  // BITFIELD u32 is big-endian; bytes past the string's end read as zeros.
  const word = at + 4 <= copy.words.length ? copy.words.readUInt32BE(at) : 0;
  return (word & bits) >>> 0 === bits;
}

export class SettledFilters {
  private readonly shards = new Map<string, ShardCopies>();
  private bytes = 0;

  private readonly graceS: number;

  constructor(
    private readonly bucketS: number,
    private readonly markerTtlS: number,
    private readonly maxBytes = MAX_COPY_BYTES,
  ) {
    this.graceS = Math.min(SETTLE_GRACE_S, bucketS);
  }

  /** The live buckets older than now whose filters are final by the last time a claim reported. */
  private settledBuckets(nowS: number): { from: number; to: number } {
    return { from: Math.floor((nowS - this.markerTtlS) / this.bucketS), to: Math.floor((nowS - this.graceS) / this.bucketS) - 1 };
  }

  /** The copies' answers for a batch's digests on the shard whose marker base is `shardKey`. */
  vouch(shardKey: string, digests: readonly Uint8Array[]): VouchedBuckets {
    const shard = this.shards.get(shardKey);
    if (shard === undefined) return NO_VOUCHED_BUCKETS;
    const { from, to } = this.settledBuckets(shard.nowS);
    const used: Array<[number, FilterCopy]> = [];
    for (let bucket = to; bucket >= from; bucket--) {
      const copy = shard.copies.get(bucket);
      // An empty bucket costs the script one HGET: not worth a vouch.
      if (copy && copy.blocks > 0) used.push([bucket, copy]);
    }
    if (used.length === 0) return NO_VOUCHED_BUCKETS;
    const n = digests.length;
    const flags = Buffer.alloc(used.length * n, 0x30);
    for (let v = 0; v < used.length; v++) {
      const copy = used[v]![1];
      for (let i = 0; i < n; i++) if (copyMayHold(copy, digests[i]!)) flags[v * n + i] = 0x31;
    }
    return { buckets: used.map(([bucket, copy]) => `${bucket}:${copy.blocks}:${copy.markers}`).join(','), flags };
  }

  /**
   * The copies of every bucket from `from` to `to` (native-claims.ts), or
   * null when one of them is not copied (not settled yet, still loading,
   * unfiltered, or past the memory bound).
   */
  coverage(shardKey: string, from: number, to: number): Array<{ bucket: number; markers: number; mayHold: (digest: Uint8Array) => boolean }> | null {
    const shard = this.shards.get(shardKey);
    if (shard === undefined) return null;
    const covered = [];
    for (let bucket = to; bucket >= from; bucket--) {
      const copy = shard.copies.get(bucket);
      if (!copy) return null;
      covered.push({ bucket, markers: copy.markers, mayHold: (digest: Uint8Array) => copyMayHold(copy, digest) });
    }
    return covered;
  }

  /** Drops a copy whose bucket took markers since (native-claims.ts saw its count move): the next observe reads it again. */
  invalidate(shardKey: string, bucket: number): void {
    const copies = this.shards.get(shardKey)?.copies;
    const copy = copies?.get(bucket);
    if (copy === undefined) return;
    copies!.delete(bucket);
    if (copy) this.bytes -= copy.words.length;
  }

  /** The grace after a bucket's end before its filter is copied. */
  get settleGraceS(): number {
    return this.graceS;
  }

  /**
   * After a claim on the shard: the server's time. Copies of buckets no
   * longer live are dropped; buckets newly settled are read in the
   * background (the batch does not wait; until a copy is in, the script
   * probes that bucket itself).
   */
  observe(shardKey: string, nowS: number, connection: Redis, onError: (error: unknown) => void): void {
    let shard = this.shards.get(shardKey);
    if (shard === undefined) this.shards.set(shardKey, (shard = { copies: new Map(), loading: new Set(), nowS }));
    if (nowS > shard.nowS) shard.nowS = nowS;
    const { from, to } = this.settledBuckets(shard.nowS);
    for (const [bucket, copy] of shard.copies) {
      if (bucket >= from) continue;
      shard.copies.delete(bucket);
      if (copy) this.bytes -= copy.words.length;
    }
    for (let bucket = to; bucket >= from; bucket--) {
      if (shard.copies.has(bucket) || shard.loading.has(bucket) || this.bytes >= this.maxBytes) continue;
      shard.loading.add(bucket);
      const copies = shard.copies;
      const loading = shard.loading;
      readFilter(connection, shardKey, bucket)
        .then((copy) => {
          if (copy && this.bytes + copy.words.length > this.maxBytes) return;
          copies.set(bucket, copy);
          if (copy) this.bytes += copy.words.length;
        })
        .catch((error: unknown) => {
          // Read by the script from now on: one warning per bucket, not one per batch.
          copies.set(bucket, null);
          onError(error);
        })
        .finally(() => loading.delete(bucket));
    }
  }

  /** Bytes of filter copies held (for tests and the bound). */
  get heldBytes(): number {
    return this.bytes;
  }
}

/**
 * A settled bucket's filter with the block and marker counts it holds at
 * least; null when it has none. The counts are read before the words, in
 * one pipeline and not in a MULTI (the ACL docs/redis-requirements.md
 * recommends grants no @transaction): a bucket's filter only gains bits, so
 * words read after the count hold every bit of the markers it counts, and a
 * marker written in between raises `n` past the copy's, which the script
 * then refuses to trust.
 */
async function readFilter(connection: Redis, shardKey: string, bucket: number): Promise<FilterCopy | null> {
  const replies = await connection.pipeline().hmget(`${shardKey}:${bucket}:m`, 'f', 'n', 's').getBuffer(`${shardKey}:${bucket}:f`).exec();
  if (replies === null) return null;
  for (const [error] of replies) if (error) throw error;
  const [f, n, s] = replies[0]![1] as [string | null, string | null, string | null];
  const words = replies[1]![1] as Buffer | null;
  // Never opened: it holds nothing, as long as its marker count stays absent (checked where the copy is used).
  if (f === null && n === null && s === null && words === null) return EMPTY_COPY;
  const blocks = Number(f);
  // A filter key gone while its bucket lives (deleted by hand) answers "not held" for everything: not copied.
  if (!Number.isInteger(blocks) || blocks <= 0 || words === null) return null;
  return { blocks, markers: n === null ? -1 : Number(n), words };
}

const EMPTY_COPY: FilterCopy = Object.freeze({ blocks: 0, markers: -1, words: Buffer.alloc(0) });

/** One per thread and marker timing: a thread's settings never change, so in practice one. */
const perTiming = new Map<string, SettledFilters>();
export function settledFiltersOf(bucketS: number, markerTtlS: number): SettledFilters {
  const key = `${bucketS}:${markerTtlS}`;
  let filters = perTiming.get(key);
  if (filters === undefined) perTiming.set(key, (filters = new SettledFilters(bucketS, markerTtlS)));
  return filters;
}
