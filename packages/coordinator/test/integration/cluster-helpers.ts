/**
 * Reading a Redis Cluster (or any TALLY_REDIS_URL) from the tests: the same
 * factory and scans the CLI uses, so a test sees what an operator would.
 */
import { connectRedis, scanNodes, type RedisClient } from '@tally/runtime';
import { markerDigest, markerShardOf, type MarkerScope } from '@tally/shared';
import { markerEntry, readMarkers } from '@tally/testkit';
import { readCounts } from '../../src/commands/counts.js';
import { readStats } from '../../src/commands/stats.js';
import type { PartsById } from './crash-window.js';

export async function withRedisAt<T>(url: string, run: (redis: RedisClient) => Promise<T>): Promise<T> {
  const redis = await connectRedis(url, 'tally-test');
  redis.on('error', () => {});
  try {
    return await run(redis);
  } finally {
    redis.disconnect();
  }
}

export async function countsAt(url: string, prefix: string, virtualShards: number): Promise<Map<string, number>> {
  return withRedisAt(url, async (redis) => {
    const raw = await readCounts(redis, { prefix, virtualShards }, []);
    return new Map([...raw].map(([sku, value]) => [sku, Number(value)]));
  });
}

export async function statsAt(url: string, prefix: string): Promise<Awaited<ReturnType<typeof readStats>>> {
  return withRedisAt(url, (redis) => readStats(redis, { prefix }));
}

/** Every occupied marker of the prefix, as markerEntry(vshard, id) (`<vshard>:<digest hex>`), from every master. */
export async function markedParts(redis: RedisClient, prefix: string): Promise<Set<string>> {
  return new Set((await readMarkers(redis, prefix)).done);
}

/**
 * Parts of good messages whose marker is missing. Every acked part has its
 * marker occupied (or found occupied) first, and markers outlive a test run,
 * so after a full drain this is 0 whatever the kills did: an exact check,
 * unlike the counters, whose last second a SIGKILL drops.
 */
export function unmarkedGoodParts(parts: PartsById, marked: ReadonlySet<string>, scope: MarkerScope = 'part', virtualShards = 16): number {
  let missing = 0;
  for (const [id, byShard] of parts) {
    // Message scope: one marker per message, on its marker shard; it stands for every part.
    if (scope === 'message') {
      if (!marked.has(markerEntry(markerShardOf(markerDigest(id), virtualShards), id))) missing += byShard.size;
      continue;
    }
    for (const vshard of byShard.keys()) if (!marked.has(markerEntry(vshard, id))) missing++;
  }
  return missing;
}

/** Count keys per master: shows the keys really spread over the cluster. */
export async function countKeysPerMaster(redis: RedisClient, prefix: string): Promise<number[]> {
  return Promise.all(
    scanNodes(redis).map(async (node) => {
      let cursor = '0';
      let total = 0;
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}c:*`, 'COUNT', 10_000);
        cursor = next;
        total += keys.length;
      } while (cursor !== '0');
      return total;
    }),
  );
}
