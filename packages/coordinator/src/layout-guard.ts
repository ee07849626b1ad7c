import type { Redis } from 'ioredis';
import { layoutKey, SHARD_HASH, ShardLayoutMismatchError, type TallyConfig } from '@tally/shared';

export interface Layout {
  readonly virtualShards: number;
  readonly hash: string;
  readonly created: boolean;
}

/**
 * Records the virtual-shard layout of a prefix the first time a daemon starts
 * on it, and refuses to start when a later daemon disagrees (invariant 3).
 * HSETNX makes the first writer win when several daemons start at once.
 */
export async function ensureLayout(redis: Redis, config: Pick<TallyConfig, 'prefix' | 'virtualShards' | 'mode'>): Promise<Layout> {
  const key = layoutKey(config.prefix);
  const created = (await redis.hsetnx(key, 'virtual_shards', String(config.virtualShards))) === 1;
  await redis.hsetnx(key, 'hash', SHARD_HASH);
  await redis.hsetnx(key, 'created_at', new Date().toISOString());
  const stored = await redis.hgetall(key);
  const storedShards = Number(stored.virtual_shards);
  if (storedShards !== config.virtualShards) {
    throw new ShardLayoutMismatchError(
      `TALLY_VIRTUAL_SHARDS is ${config.virtualShards} but prefix "${config.prefix}" was laid out with ${stored.virtual_shards} virtual shards ` +
        `(Redis key ${key}). Changing it would move SKUs between shards and let redeliveries skip or repeat parts. ` +
        `Set TALLY_VIRTUAL_SHARDS=${stored.virtual_shards}, or use a new TALLY_PREFIX.`,
    );
  }
  if (stored.hash !== SHARD_HASH) {
    throw new ShardLayoutMismatchError(
      `prefix "${config.prefix}" was laid out with shard hash "${stored.hash}", this build uses "${SHARD_HASH}"; use a new TALLY_PREFIX.`,
    );
  }
  return { virtualShards: storedShards, hash: SHARD_HASH, created };
}
