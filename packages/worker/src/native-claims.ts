/**
 * Two-step mode's claims by native commands: the claim script's common case
 * (every digest new) without Lua, one pipeline per batch.
 *
 * Why: the claim script spends most of its Redis CPU in the interpreter (its
 * argument conversions, tables and string work), not in Redis's data
 * structures: 5.7–7.8 µs per digest where `HSETNX` plus the filter bits
 * cost 4.2–5.4 natively, in a bucket of 1M markers
 * (bench/results/native-claims/README.md). Claims are the largest part of
 * what two-step mode costs Redis per message; the price is the daemon's CPU
 * (one ioredis command per digest), which is why it is opt-in.
 *
 * The pipeline, in this order, on the shard's connection:
 *   TIME; the batch's claim record (`b<id>` in the bucket's meta hash); that
 *   the filter exists; the digests' filter bits (BITFIELD SET u1); one
 *   HSETNX per digest into the bucket of now; EXPIREAT of the hashes it
 *   touched whose expiry this thread has not set in the last
 *   EXPIRY_MEMORY_MS; the bucket's marker count; then the reads that decide
 *   whether to trust it: each older live bucket's marker count, the
 *   bucket's sub-bucket and block counts, TIME.
 *
 * Why it is as safe as the script (docs/architecture.md, "Native claims"):
 * - A digest two claimers race for in one bucket: HSETNX lets one win.
 * - A script claiming the same digest in the same bucket reads the filter,
 *   then the hash, atomically; the pipeline sets the bits before its HSETNX,
 *   so the script either finds the claim or claims first (and HSETNX then
 *   answers 0). A marker never names a batch without a record: the record
 *   is written first.
 * - Another bucket: the claims are trusted only when both TIMEs, read by
 *   the server around every write, fall in the same bucket, past the grace
 *   after its start (so every older live bucket has settled and this thread
 *   holds a copy of its filter, checked against its marker count after the
 *   writes) and before its end (so a later claimer, script or native, reads
 *   this bucket as a live one). A digest a copy may hold (a duplicate, or a
 *   false positive) is not claimed here: it goes to the claim script.
 * Anything else (a TIME outside the window, a copy whose count moved, a
 * bucket reshaped, an error) throws the pipeline's claims away: the claim
 * script runs for the whole batch, as it would have without this path, and
 * the record is deleted after it, so claims it did not take again read as
 * no claim at all.
 *
 * Only buckets with a filter (message-scoped and filtered formats): an
 * unfiltered bucket has no copies to settle on.
 */
import { randomBytes } from 'node:crypto';
import { bucketOf, filterSlotOf, isPowerOfTwo, oldestLiveBucket, PART_DONE, PART_NEW, subBucketOf } from '@tally/shared';
import type { Redis } from 'ioredis';
import type { SettledFilters } from './settled-filters.js';

/** Seconds of slack around the window in which claims are trusted: the server's clock as this thread estimates it may be off by that much. */
export const CLOCK_SLACK_S = 2;
/**
 * How far the claim record's time (this thread's estimate of the server's
 * clock) may be from the server's TIME before the claims are not trusted:
 * other daemons judge the claim live or expired by it, against a claim TTL
 * of seconds.
 */
export const CLAIM_TIME_SLACK_MS = 1_000;

/** A clock that does not step when the system's is set (NTP): the estimate is an offset from it. */
function steadyNowMs(): number {
  return performance.timeOrigin + performance.now();
}

/** The shape of a shard's bucket of now: its hashes and filter blocks (meta `s`, `f`), fixed once the bucket is opened. */
interface BucketShape {
  readonly bucket: number;
  readonly subs: number;
  readonly blocks: number;
}

/** How long a thread trusts that a hash it set the expiry of still has it (see NativeClaims.expiring). */
export const EXPIRY_MEMORY_MS = 1_000;

/** Per shard: its bucket of now, which of the bucket's hashes this thread set the expiry of since `since` (performance.now()), their keys. */
interface ExpiringHashes {
  readonly bucket: number;
  readonly subs: Uint8Array;
  readonly keys: Array<string | undefined>;
  since: number;
}

/** A part the pipeline leaves to the claim script (a copy may hold it, or its field was there): beside PART_NEW and PART_DONE in a plan. */
export const PART_PENDING = 9;

export interface NativePlan {
  readonly shardKey: string;
  readonly bucket: number;
  readonly subs: number;
  readonly blocks: number;
  /** The batch's claim id in the bucket: its markers' value, its record `b<id>`. */
  readonly id: string;
  /** Per part: PART_NEW (claimed by the pipeline if HSETNX answers 1), PART_DONE (repeat in the batch), PART_PENDING. */
  readonly parts: Uint8Array;
  /** The server's time the plan was made for, ms: the claim record's time. */
  readonly atMs: number;
  /** The oldest bucket the plan counted as live: the server's clock must not make an older one live. */
  readonly oldest: number;
  /** The older live buckets the pipeline checks, with the marker counts of their copies (-1: empty). */
  readonly checked: ReadonlyArray<{ readonly bucket: number; readonly markers: number }>;
}

export interface NativeOutcome {
  /** Whether the claims can be trusted; if not, the claim script runs for the whole batch (and the record is deleted). */
  readonly accepted: boolean;
  /** Per part: PART_NEW claimed here, PART_DONE a repeat in the batch, PART_PENDING for the claim script. */
  readonly parts: Uint8Array;
  /** The server's time after the writes, seconds. */
  readonly nowS: number;
  /** An older bucket whose marker count moved since its filter was copied: the copy must be read again. */
  readonly staleCopy: number | null;
  /** Why the claims were not trusted, or null: for a reader in a debugger (refusals near a boundary are routine, not logged). */
  readonly refusedBecause: string | null;
}

export class NativeClaims {
  private readonly shapes = new Map<string, BucketShape>();
  private readonly learning = new Set<string>();
  /** Per shard (its node's clock), the server's clock minus this thread's steady clock, ms, once a TIME has been read. */
  private readonly offsetMs = new Map<string, number>();
  /**
   * Per shard, the hashes of its bucket of now this thread has set the
   * expiry of (by sub-bucket) in the last EXPIRY_MEMORY_MS: a batch into
   * one of them sends no EXPIREAT. At steady state a batch of 500 spreads
   * over hundreds of hashes, and an EXPIREAT per hash per batch was more
   * than one command in two per digest. Forgotten after EXPIRY_MEMORY_MS,
   * and after a pipeline that was refused or failed, because a hash can
   * vanish while its bucket lives (an occupation deleting refused claims
   * empties it, eviction, a failover losing the tail), and the HSETNX that
   * recreates it sets no expiry: a batch into it after that sets it again.
   */
  private readonly expiring = new Map<string, ExpiringHashes>();
  /** Per shard, the newest bucket whose hashes sweepBefore has given their expiry; the shards being swept. */
  private readonly swept = new Map<string, number>();
  private readonly sweeping = new Set<string>();
  private readonly idPrefix = `n${randomBytes(6).toString('base64url')}`;
  private batches = 0;

  constructor(
    private readonly bucketS: number,
    private readonly markerTtlS: number,
    /** The settled filters' grace after a bucket's end (settled-filters.ts): before it, older buckets have no copies. */
    private readonly graceS: number,
  ) {}

  /** The server's time as this thread estimates it, ms; `skewMs` (tests) shifts the estimate. */
  private estimatedNowMs(shardKey: string, skewMs = 0): number | null {
    const offset = this.offsetMs.get(shardKey);
    return offset === undefined ? null : steadyNowMs() + offset + skewMs;
  }

  /** A coarse clock from a claim script's reply (whole seconds) until a pipeline's TIME gives a finer one. */
  observeSeconds(shardKey: string, serverS: number): void {
    if (!this.offsetMs.has(shardKey)) this.offsetMs.set(shardKey, serverS * 1000 + 500 - steadyNowMs());
  }

  /**
   * After a claim script named the bucket of now: learn its shape in the
   * background (one HMGET), so the next batch of the shard can claim natively.
   */
  learnShape(shardKey: string, bucket: number, connection: Redis, onError: (error: unknown) => void): void {
    const known = this.shapes.get(shardKey);
    if ((known !== undefined && known.bucket >= bucket) || this.learning.has(shardKey)) return;
    this.learning.add(shardKey);
    connection
      .hmget(`${shardKey}:${bucket}:m`, 's', 'f')
      .then(([s = null, f = null]) => {
        const shape = markerShape(s, f);
        if (shape !== null) this.shapes.set(shardKey, { bucket, ...shape });
      })
      .catch(onError)
      .finally(() => this.learning.delete(shardKey));
  }

  /**
   * Once per bucket of now and shard, in the background: every key of the
   * older live buckets (hashes, meta, filter) that has no expiry gets its
   * bucket's (`EXPIREAT … NX`, which leaves every other key as it is). The
   * pipeline's EXPIREAT is a command of its own after the HSETNX that
   * created the hash: a daemon SIGKILLed between the two, or a failover
   * that lost the tail of the replication stream (which can take an earlier
   * sweep with it), leaves a key that would never expire, and the bucket's
   * later batches set it again only while the bucket is of now. So every
   * older live bucket is swept again in each bucket of now, not only the
   * one just ended. Per bucket width: one HGET per live bucket and one
   * command per key, nothing per message. A bucket whose meta has expired
   * is not found.
   */
  sweepBefore(shardKey: string, bucket: number, connection: Redis, onError: (error: unknown) => void): void {
    const last = this.swept.get(shardKey);
    if ((last !== undefined && last >= bucket - 1) || this.sweeping.has(shardKey)) return;
    this.sweeping.add(shardKey);
    const from = oldestLiveBucket(bucket * this.bucketS, this.bucketS, this.markerTtlS);
    const buckets: number[] = [];
    for (let b = from; b < bucket; b++) buckets.push(b);
    this.sweep(shardKey, buckets, connection)
      .then(() => this.swept.set(shardKey, Math.max(bucket - 1, this.swept.get(shardKey) ?? -Infinity)), onError)
      .finally(() => this.sweeping.delete(shardKey));
  }

  private async sweep(shardKey: string, buckets: readonly number[], connection: Redis): Promise<void> {
    if (buckets.length === 0) return;
    const reads = connection.pipeline();
    for (const b of buckets) reads.hget(`${shardKey}:${b}:m`, 's');
    const shapes = await execOrThrow(reads);
    const writes = connection.pipeline();
    buckets.forEach((b, j) => {
      const subs = Number(shapes[j]);
      if (shapes[j] === null || !isPowerOfTwo(subs)) return;
      const expiresAt = (b + 1) * this.bucketS + this.markerTtlS;
      for (let sub = 0; sub < subs; sub++) writes.expireat(`${shardKey}:${b}:${sub}`, expiresAt, 'NX');
      // A filter recreated by a pipeline's BITFIELD after it was lost, and cut before the pipeline deleted it again.
      writes.expireat(`${shardKey}:${b}:f`, expiresAt, 'NX');
      writes.expireat(`${shardKey}:${b}:m`, expiresAt, 'NX');
    });
    if (writes.length > 0) await execOrThrow(writes);
  }

  /** The pipeline for a batch, or null when this batch must go to the claim script (no clock yet, near a boundary, a bucket unknown or uncopied). */
  plan(shardKey: string, digests: readonly Uint8Array[], settled: SettledFilters, skewMs = 0): NativePlan | null {
    const nowMs = this.estimatedNowMs(shardKey, skewMs);
    const shape = this.shapes.get(shardKey);
    if (nowMs === null || shape === undefined) return null;
    const nowS = nowMs / 1000;
    const bucket = bucketOf(Math.floor(nowS), this.bucketS);
    if (bucket !== shape.bucket) return null;
    const start = bucket * this.bucketS;
    if (nowS < start + this.graceS + CLOCK_SLACK_S || nowS > start + this.bucketS - CLOCK_SLACK_S) return null;
    const oldest = oldestLiveBucket(Math.floor(nowS) - CLOCK_SLACK_S, this.bucketS, this.markerTtlS);
    const copies = settled.coverage(shardKey, oldest, bucket - 1);
    if (copies === null) return null;
    const parts = new Uint8Array(digests.length);
    const seen = new Set<string>();
    for (let i = 0; i < digests.length; i++) {
      const digest = digests[i]!;
      const text = Buffer.from(digest.buffer, digest.byteOffset, digest.byteLength).toString('latin1');
      if (seen.has(text)) {
        parts[i] = PART_DONE;
        continue;
      }
      seen.add(text);
      parts[i] = copies.some(({ mayHold }) => mayHold(digest)) ? PART_PENDING : PART_NEW;
    }
    if (!parts.includes(PART_NEW)) return null;
    this.batches++;
    return {
      shardKey,
      bucket,
      subs: shape.subs,
      blocks: shape.blocks,
      id: `${this.idPrefix}${this.batches.toString(36)}`,
      parts,
      oldest,
      atMs: Math.round(nowMs),
      checked: copies.map(({ bucket: b, markers }) => ({ bucket: b, markers })),
    };
  }

  /** The bucket's expiry flags (fresh ones after EXPIRY_MEMORY_MS) and hash keys by sub-bucket, for `shardKey`'s bucket of now. */
  private hashesOf(shardKey: string, bucket: number, subs: number): ExpiringHashes {
    let known = this.expiring.get(shardKey);
    const now = performance.now();
    if (known === undefined || known.bucket !== bucket || known.subs.length !== subs) {
      known = { bucket, subs: new Uint8Array(subs), keys: new Array<string | undefined>(subs), since: now };
      this.expiring.set(shardKey, known);
    } else if (now - known.since > EXPIRY_MEMORY_MS) {
      known.subs.fill(0);
      known.since = now;
    }
    return known;
  }

  /**
   * Runs the pipeline (module comment); throws only when the connection
   * fails. The caller's retry plans again under a new id: the fields this
   * attempt claimed answer HSETNX 0 then, and the script takes them again as
   * this daemon's own.
   */
  async run(connection: Redis, plan: NativePlan, digests: readonly Uint8Array[], claimToken: string): Promise<NativeOutcome> {
    const { shardKey, bucket, subs, blocks, id } = plan;
    const meta = `${shardKey}:${bucket}:m`;
    const expiresAt = (bucket + 1) * this.bucketS + this.markerTtlS;
    const claimed: number[] = [];
    for (let i = 0; i < plan.parts.length; i++) if (plan.parts[i] === PART_NEW) claimed.push(i);
    const pipeline = connection.pipeline();
    pipeline.time();
    pipeline.hset(meta, `b${id}`, `c${claimToken}:${plan.atMs}`);
    // A filter key gone (deleted by hand, evicted) tells the scripts to read
    // the hashes; the BITFIELD would bring it back holding only these bits.
    const filterKey = `${shardKey}:${bucket}:f`;
    pipeline.exists(filterKey);
    const bits: Array<string | number> = [];
    for (const i of claimed) {
      const { block, bits: mask } = filterSlotOf(digests[i]!, blocks);
      for (let b = 0; b < 32; b++) if ((mask >>> b) & 1) bits.push('SET', 'u1', block * 32 + 31 - b, 1);
    }
    pipeline.call('BITFIELD', filterKey, ...bits);
    const hashes = this.hashesOf(shardKey, bucket, subs);
    const unexpiring = new Set<number>();
    for (const i of claimed) {
      const digest = digests[i]!;
      const sub = subBucketOf(digest, subs);
      if (hashes.subs[sub] === 0) unexpiring.add(sub);
      const key = (hashes.keys[sub] ??= `${shardKey}:${bucket}:${sub}`);
      pipeline.hsetnx(key, Buffer.from(digest.buffer, digest.byteOffset, digest.byteLength), id);
    }
    const toExpire = [...unexpiring];
    for (const sub of toExpire) pipeline.expireat(hashes.keys[sub]!, expiresAt);
    pipeline.hincrby(meta, 'n', claimed.length);
    for (const { bucket: b } of plan.checked) pipeline.hget(`${shardKey}:${b}:m`, 'n');
    pipeline.hmget(meta, 's', 'f');
    pipeline.time();
    let replies: Awaited<ReturnType<typeof pipeline.exec>>;
    try {
      replies = await pipeline.exec();
    } catch (error) {
      hashes.subs.fill(0);
      throw error;
    }
    const parts = Uint8Array.from(plan.parts);
    const refuse = (because: string, nowS: number, staleCopy: number | null = null): NativeOutcome => {
      // Whatever went wrong may have taken a hash with it: the next batch sets every expiry again.
      hashes.subs.fill(0);
      return { accepted: false, parts, nowS, refusedBecause: because, staleCopy };
    };
    if (replies === null) return refuse('the pipeline was discarded', 0);
    // An EXPIREAT that answered 1 set its hash's expiry (a refusal below forgets them all).
    const firstExpiry = 4 + claimed.length;
    toExpire.forEach((sub, j) => {
      const [error, set] = replies[firstExpiry + j]!;
      if (error === null && set === 1) hashes.subs[sub] = 1;
    });
    const failed = replies.find(([error]) => error);
    const last = replies[replies.length - 1]![1] as [string, string] | undefined;
    const endMs = last === undefined ? 0 : Number(last[0]) * 1000 + Math.floor(Number(last[1]) / 1000);
    if (endMs > 0) this.offsetMs.set(shardKey, endMs - steadyNowMs());
    const nowS = Math.floor(endMs / 1000);
    if (replies[2]![1] === 0) {
      // Gone again, as it was: the scripts read this bucket's hashes.
      await connection.del(filterKey);
      return refuse(`bucket ${bucket} has lost its filter`, nowS);
    }
    if (failed) return refuse(`a command failed: ${String(failed[0])}`, nowS);
    const first = replies[0]![1] as [string, string];
    const startS = Number(first[0]) + Number(first[1]) / 1e6;
    const endS = endMs / 1000;
    const start = bucket * this.bucketS;
    if (startS < start + this.graceS || endS >= start + this.bucketS)
      return refuse(`the server's clock (${startS}..${endS}) left the window of bucket ${bucket}`, nowS);
    if (Math.abs(startS * 1000 - plan.atMs) > CLAIM_TIME_SLACK_MS)
      return refuse(`the claim's time is ${Math.round(plan.atMs - startS * 1000)} ms off the server's clock`, nowS);
    if (oldestLiveBucket(Math.floor(startS), this.bucketS, this.markerTtlS) < plan.oldest) return refuse('a live bucket was not checked', nowS);
    let at = 4;
    for (const i of claimed) {
      if (replies[at]![1] !== 1) parts[i] = PART_PENDING;
      at++;
    }
    at += toExpire.length + 1;
    for (const { bucket: b, markers } of plan.checked) {
      const n = replies[at++]![1] as string | null;
      if ((n === null ? -1 : Number(n)) !== markers) return refuse(`bucket ${b} took markers after its filter was copied`, nowS, b);
    }
    const [s, f] = replies[at]![1] as [string | null, string | null];
    const shape = markerShape(s, f);
    if (shape === null || shape.subs !== subs || shape.blocks !== blocks) return refuse(`bucket ${bucket} changed shape`, nowS);
    return { accepted: true, parts, nowS, refusedBecause: null, staleCopy: null };
  }

  /**
   * After a refused pipeline and the claim script that replaced it: its
   * claims read as no claim from now on. Best effort: a record left behind
   * holds its fields for the claim TTL, then they read as expired claims.
   */
  static async forget(connection: Redis, plan: NativePlan, onError: (error: unknown) => void): Promise<void> {
    await connection.hdel(`${plan.shardKey}:${plan.bucket}:m`, `b${plan.id}`).catch(onError);
  }
}

/** One per thread and marker timing (a thread's settings never change, so in practice one). */
const perTiming = new Map<string, NativeClaims>();
export function nativeClaimsOf(bucketS: number, markerTtlS: number, graceS: number): NativeClaims {
  const key = `${bucketS}:${markerTtlS}:${graceS}`;
  let claims = perTiming.get(key);
  if (claims === undefined) perTiming.set(key, (claims = new NativeClaims(bucketS, markerTtlS, graceS)));
  return claims;
}

/** A pipeline's replies, or its first error thrown. */
async function execOrThrow(pipeline: ReturnType<Redis['pipeline']>): Promise<unknown[]> {
  const replies = (await pipeline.exec()) ?? [];
  const failed = replies.find(([error]) => error);
  if (failed) throw failed[0];
  return replies.map(([, value]) => value);
}

/** A bucket's shape from its meta fields `s` and `f`, or null when it has no filter (or is not open). */
function markerShape(s: string | null, f: string | null): { subs: number; blocks: number } | null {
  const subs = Number(s);
  const blocks = Number(f);
  // A power of two, as the scripts open buckets with: subBucketOf masks where the scripts take a modulo.
  return s !== null && f !== null && isPowerOfTwo(subs) && Number.isInteger(blocks) && blocks > 0 ? { subs, blocks } : null;
}
