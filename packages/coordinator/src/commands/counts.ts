import type { Redis } from 'ioredis';
import { countKey, countScanPattern, shardOf, skuOfCountKey, type TallyConfig } from '@tally/shared';

/**
 * Reads counts as raw integer strings: Redis counts are 64-bit, and a value
 * beyond 2^53 must print exactly, not rounded through a double.
 */
export async function readCounts(redis: Redis, config: Pick<TallyConfig, 'prefix' | 'virtualShards'>, skus: readonly string[]): Promise<Map<string, string>> {
  const counts = new Map<string, string>();
  if (skus.length > 0) {
    const pipeline = redis.pipeline();
    for (const sku of skus) pipeline.get(countKey(config.prefix, shardOf(sku, config.virtualShards), sku));
    const results = (await pipeline.exec()) ?? [];
    skus.forEach((sku, i) => {
      const [error, value] = results[i] ?? [null, null];
      if (error) throw error;
      if (typeof value === 'string') counts.set(sku, value);
    });
    return counts;
  }
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', countScanPattern(config.prefix), 'COUNT', 1000);
    cursor = next;
    if (keys.length === 0) continue;
    // GETs in a pipeline rather than MGET: on Redis Cluster the keys span slots.
    const pipeline = redis.pipeline();
    for (const key of keys) pipeline.get(key);
    const results = (await pipeline.exec()) ?? [];
    keys.forEach((key, i) => {
      const sku = skuOfCountKey(config.prefix, key);
      const value = results[i]?.[1];
      if (sku !== null && typeof value === 'string') counts.set(sku, value);
    });
  } while (cursor !== '0');
  return counts;
}

/** One JSON object, SKUs sorted, integers printed exactly. */
export function countsToJson(counts: Map<string, string>): string {
  const entries = [...counts.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const body = entries.map(([sku, value]) => `${JSON.stringify(sku)}:${/^-?\d+$/.test(value) ? value : JSON.stringify(value)}`);
  return `{${body.join(',')}}`;
}
