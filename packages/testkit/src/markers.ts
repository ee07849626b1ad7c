/**
 * Reads a prefix's markers straight from Redis, for tests and the bench:
 * which message parts are marked done, which are only claimed. Scans every
 * marker hash of the prefix (SCAN + HGETALL), so it sees markers of any
 * bucket, whatever the clock; on a Redis Cluster, every master.
 */
import type { Cluster, Redis } from 'ioredis';
import { markerDigest, markerMetaKey, markerScanPattern, parseMarkerBucketKey } from '@tally/shared';

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
