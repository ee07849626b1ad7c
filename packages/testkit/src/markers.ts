/**
 * Reads a prefix's markers straight from Redis, for tests and the bench:
 * which message parts are marked done, which are only claimed. Scans every
 * marker hash of the prefix (SCAN + HGETALL), so it sees markers of any
 * bucket, whatever the clock; on a Redis Cluster, every master.
 */
import type { Cluster, Redis } from 'ioredis';
import {
  bucketExpiresAt,
  bucketOf,
  layoutKey,
  markerBucketKey,
  markerDigest,
  markerMetaKey,
  markerScanPattern,
  oldestLiveBucket,
  parseMarkerBucketKey,
  subBucketOf,
} from '@tally/shared';

export interface MarkerSnapshot {
  /** `<vshard>:<digest hex>` of every done marker. */
  readonly done: ReadonlySet<string>;
  /** `<vshard>:<digest hex>` of every claim (two-step: a part being counted), with its batch's claim record. */
  readonly claims: ReadonlyMap<string, string>;
  /** Marker hashes scanned. */
  readonly hashes: number;
}

/** The snapshot entry of a message's part on a shard. */
export function markerEntry(vshard: number, id: string): string {
  return `${vshard}:${markerDigest(id).toString('hex')}`;
}

export async function readMarkers(redis: Redis | Cluster, prefix: string): Promise<MarkerSnapshot> {
  const done = new Set<string>();
  const claims = new Map<string, string>();
  let hashes = 0;
  // Keys are scanned node by node (a cluster's SCAN is per node); they are read through the client, which routes by key.
  const nodes: Redis[] = 'nodes' in redis && typeof redis.nodes === 'function' ? (redis as Cluster).nodes('master') : [redis as Redis];
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', markerScanPattern(prefix), 'COUNT', 2000);
      cursor = next;
      for (const key of keys) {
        const parsed = parseMarkerBucketKey(prefix, key);
        if (parsed === null) continue;
        hashes++;
        // As a flat array of Buffers: hgetallBuffer keys an object by the field decoded as UTF-8, which mangles binary digests.
        const flat = (await redis.callBuffer('HGETALL', key)) as Buffer[];
        // A value is '1' (done) or the number of the two-step batch that claimed it: its record in the bucket's meta hash says which.
        const records = await redis.hgetall(markerMetaKey(prefix, parsed.vshard, parsed.bucket));
        for (let i = 0; i < flat.length; i += 2) {
          const entry = `${parsed.vshard}:${flat[i]!.toString('hex')}`;
          const value = flat[i + 1]!.toString('utf8');
          const state = value === '1' ? '1' : (records[`b${value}`] ?? `batch ${value} without a record`);
          if (state === '1') done.add(entry);
          else if (!done.has(entry)) claims.set(entry, state);
        }
      }
    } while (cursor !== '0');
  }
  // Done in one bucket wins over a claim left in another.
  for (const entry of done) claims.delete(entry);
  return { done, claims, hashes };
}

/** A message's part on a shard, by its marker digest. */
export interface MarkerRef {
  readonly vshard: number;
  readonly digest: Uint8Array;
}

/**
 * Whether each part's marker is done now, read the way the scripts read it:
 * every live bucket (the layout's bucket width, the marker TTL given, the
 * server's clock), one HMGET per hash and bucket. Much cheaper than
 * `readMarkers` when only a few parts are asked about among millions of
 * markers. Standalone Redis (a test's own server).
 */
export async function markersDone(redis: Redis, prefix: string, markerTtlS: number, parts: readonly MarkerRef[]): Promise<boolean[]> {
  const done = parts.map(() => false);
  if (parts.length === 0) return done;
  const widthS = Number(await redis.hget(layoutKey(prefix), 'marker_bucket_s'));
  if (!(widthS > 0)) throw new Error(`no marker_bucket_s in the layout of ${prefix}: no daemon laid the prefix out`);
  const [seconds] = await redis.time();
  const nowS = Number(seconds);
  const shards = [...new Set(parts.map((part) => part.vshard))];
  for (let bucket = bucketOf(nowS, widthS); bucket >= oldestLiveBucket(nowS, widthS, markerTtlS); bucket--) {
    // Each shard's bucket: its sub-bucket count and batch records.
    const metas = new Map<number, Record<string, string>>();
    const metaReads = redis.pipeline();
    for (const vshard of shards) metaReads.hgetall(markerMetaKey(prefix, vshard, bucket));
    ((await metaReads.exec()) ?? []).forEach(([error, meta], i) => {
      if (error) throw error;
      if (typeof (meta as Record<string, string>).s === 'string') metas.set(shards[i]!, meta as Record<string, string>);
    });
    const asked: number[] = [];
    const reads = redis.pipeline();
    parts.forEach((part, i) => {
      const meta = metas.get(part.vshard);
      if (done[i] || meta === undefined) return;
      asked.push(i);
      reads.hgetBuffer(markerBucketKey(prefix, part.vshard, bucket, subBucketOf(part.digest, Number(meta.s))), Buffer.from(part.digest));
    });
    ((await reads.exec()) ?? []).forEach(([error, value], j) => {
      if (error) throw error;
      if (value === null) return;
      const i = asked[j]!;
      const text = (value as Buffer).toString('utf8');
      if (text === '1' || metas.get(parts[i]!.vshard)![`b${text}`] === '1') done[i] = true;
    });
  }
  return done;
}

/** Where a staged marker goes: a message's part on a shard, in the bucket of the server's now. */
export interface MarkerPlace {
  readonly prefix: string;
  readonly vshard: number;
  readonly id: string;
  /** The prefix's bucket width (its layout's `marker_bucket_s`). */
  readonly widthS: number;
  readonly markerTtlS: number;
  /** Sub-buckets of the bucket if this write opens it (default 256). */
  readonly subBuckets?: number;
}

/**
 * Writes a marker value for a message's part the way the scripts do (the
 * bucket's sub-bucket count, the bucket's expiry on its hashes): `valueFor`
 * gives the value, given the bucket's meta key and the server's clock in ms.
 * Standalone Redis.
 */
async function writeMarkerValue(redis: Redis, place: MarkerPlace, valueFor: (meta: string, nowMs: number) => Promise<string>): Promise<void> {
  const { prefix, vshard, id, widthS, markerTtlS } = place;
  const [seconds, micros] = await redis.time();
  const bucket = bucketOf(Number(seconds), widthS);
  const meta = markerMetaKey(prefix, vshard, bucket);
  await redis.hsetnx(meta, 's', place.subBuckets ?? 256);
  await redis.expireat(meta, bucketExpiresAt(bucket, widthS, markerTtlS));
  const subs = Number(await redis.hget(meta, 's'));
  const key = markerBucketKey(prefix, vshard, bucket, subBucketOf(markerDigest(id), subs));
  await redis.hset(key, markerDigest(id), await valueFor(meta, Number(seconds) * 1000 + Math.floor(Number(micros) / 1000)));
  await redis.expireat(key, bucketExpiresAt(bucket, widthS, markerTtlS));
  await redis.hincrby(meta, 'n', 1);
}

/**
 * Writes a done marker for a message's part the way atomic_batch.lua does,
 * for tests that stage what another daemon left behind. Standalone Redis.
 */
export function writeDoneMarker(redis: Redis, place: MarkerPlace): Promise<void> {
  return writeMarkerValue(redis, place, () => Promise.resolve('1'));
}

/**
 * Writes a live two-step claim of daemon `token` on a message's part, made
 * now, the way claim_markers.lua does (a new batch number in the bucket's
 * meta, its record `c<token>:<ms>`, the number as the marker's value): what
 * a daemon killed between its pre-check and its occupation leaves behind.
 * Standalone Redis.
 */
export function writeClaim(redis: Redis, place: MarkerPlace, token: string): Promise<void> {
  return writeMarkerValue(redis, place, async (meta, nowMs) => {
    const batch = (await redis.hincrby(meta, 'b', 1)) + 1;
    await redis.hset(meta, `b${batch}`, `c${token}:${nowMs}`);
    return String(batch);
  });
}
