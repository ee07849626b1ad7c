/**
 * `tally counts`: every SKU's count under the prefix (or the SKUs named), read as exact integer strings.
 */
import { scanNodes, type RedisClient } from '@tally/runtime';
import { countKey, countScanPattern, shardOf, skuOfCountKey, type TallyConfig } from '@tally/shared';

/**
 * Reads counts as raw integer strings: Redis counts are 64-bit, and a value
 * beyond 2^53 must print exactly, not rounded through a double.
 *
 * On a cluster the count keys are spread over every slot: named SKUs are
 * read one GET each (the client routes each to its slot's master), and the
 * full listing scans every master, reading the keys each one returned on that
 * master's own connection.
 */
export async function readCounts(
  redis: RedisClient,
  config: Pick<TallyConfig, 'prefix' | 'virtualShards'>,
  skus: readonly string[],
): Promise<Map<string, string>> {
  const counts = new Map<string, string>();
  if (skus.length > 0) {
    // Sent in one go (ioredis writes them in one tick), never as one multi-key command: the keys span slots.
    const values = await Promise.all(skus.map((sku) => redis.get(countKey(config.prefix, shardOf(sku, config.virtualShards), sku))));
    skus.forEach((sku, i) => {
      const value = values[i];
      if (typeof value === 'string') counts.set(sku, value);
    });
    return counts;
  }
  for (const node of scanNodes(redis)) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', countScanPattern(config.prefix), 'COUNT', 1000);
      cursor = next;
      if (keys.length === 0) continue;
      // GETs in a pipeline rather than MGET: the keys span slots, which a cluster node refuses in one command.
      const pipeline = node.pipeline();
      for (const key of keys) pipeline.get(key);
      const results = (await pipeline.exec()) ?? [];
      keys.forEach((key, i) => {
        const [error, value] = results[i] ?? [null, null];
        if (error) throw error;
        const sku = skuOfCountKey(config.prefix, key);
        if (sku !== null && typeof value === 'string') counts.set(sku, value);
      });
    } while (cursor !== '0');
  }
  return counts;
}

/** One JSON object, SKUs sorted, integers printed exactly. */
export function countsToJson(counts: Map<string, string>): string {
  const entries = [...counts.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const body = entries.map(([sku, value]) => `${JSON.stringify(sku)}:${/^-?\d+$/.test(value) ? value : JSON.stringify(value)}`);
  return `{${body.join(',')}}`;
}
