/**
 * Reads the watermarks Redis holds for one partition, per virtual shard: a
 * daemon compares them with those it has seen, so a rollback (Redis lost
 * acknowledged writes) is found even on a shard that receives nothing more,
 * which no batch would ever reveal.
 */
import { watermarkKey } from '@tally/shared';
import type { RedisClient } from '@tally/runtime';

/** Per shard asked, the watermark of `partition` (-1 when none), in the order of `shards`. */
export async function readWatermarks(redis: RedisClient, prefix: string, partition: number, shards: readonly number[]): Promise<number[]> {
  if (shards.length === 0) return [];
  // One command per key, not one pipeline: on a Redis Cluster the shards' keys are in other slots,
  // and a cluster pipeline must stay in one (ioredis refuses it). Sent together, they still share each node's round trip.
  const values = await Promise.all(shards.map((vshard) => redis.hget(watermarkKey(prefix, vshard), String(partition))));
  return shards.map((vshard, i) => {
    const value = values[i];
    if (value === null || value === undefined) return -1;
    const offset = Number(value);
    if (!Number.isSafeInteger(offset))
      throw new TypeError(`watermark of partition ${partition} on shard ${vshard} holds ${JSON.stringify(value)}, not an offset`);
    return offset;
  });
}
