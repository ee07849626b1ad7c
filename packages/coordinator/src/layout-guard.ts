import type { Redis } from 'ioredis';
import {
  layoutKey,
  markerScanPattern,
  ModeSwitchRefusedError,
  SHARD_HASH,
  ShardLayoutMismatchError,
  type TallyConfig,
  type TallyMode,
} from '@tally/shared';

export interface Layout {
  readonly virtualShards: number;
  readonly hash: string;
  readonly created: boolean;
  readonly mode: TallyMode;
  /** The mode recorded before this start, when this start switched the prefix to another one. */
  readonly switchedFrom: TallyMode | null;
}

/**
 * Prefixes laid out before the mode was recorded were run by two-step
 * daemons: the only mode there was.
 */
const MODE_OF_UNRECORDED_LAYOUT: TallyMode = 'two-step';

/** Any live idempotency marker under the prefix, with its remaining TTL; null when there is none. */
export async function findLiveMarker(redis: Redis, prefix: string): Promise<{ key: string; ttlS: number } | null> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', markerScanPattern(prefix), 'COUNT', 1000);
    cursor = next;
    for (const key of keys) {
      const ttlS = await redis.ttl(key);
      if (ttlS !== -2) return { key, ttlS };
    }
  } while (cursor !== '0');
  return null;
}

/**
 * Records the layout of a prefix the first time a daemon starts on it, and
 * refuses to start when a later daemon disagrees:
 *
 * - virtual shards and shard hash (invariant 3): a mismatch would move SKUs
 *   between shards and let a redelivery skip or repeat parts;
 * - mode: both modes use the same marker keys, so markers of one are honoured
 *   by the other, but a message handled by daemons of both modes at once can
 *   still fall into the two-step crash window that atomic mode closes. A
 *   switch is refused while any marker of the prefix is live (a daemon of the
 *   old mode may still run) and allowed once they have all expired, which
 *   takes at most the old mode's TALLY_MARKER_TTL_S after its last write.
 *
 * HSETNX makes the first writer win when several daemons start at once.
 */
export async function ensureLayout(redis: Redis, config: Pick<TallyConfig, 'prefix' | 'virtualShards' | 'mode'>): Promise<Layout> {
  const key = layoutKey(config.prefix);
  const created = (await redis.hsetnx(key, 'virtual_shards', String(config.virtualShards))) === 1;
  await redis.hsetnx(key, 'hash', SHARD_HASH);
  await redis.hsetnx(key, 'created_at', new Date().toISOString());
  await redis.hsetnx(key, 'mode', created ? config.mode : MODE_OF_UNRECORDED_LAYOUT);
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
  const recorded = (stored.mode ?? MODE_OF_UNRECORDED_LAYOUT) as TallyMode;
  if (recorded === config.mode) return { virtualShards: storedShards, hash: SHARD_HASH, created, mode: recorded, switchedFrom: null };

  const live = await findLiveMarker(redis, config.prefix);
  if (live !== null) {
    const expiry = live.ttlS >= 0 ? `the one found, ${live.key}, expires in ${live.ttlS} s` : `the one found, ${live.key}, has no TTL and must be deleted by hand`;
    throw new ModeSwitchRefusedError(
      `TALLY_MODE is ${config.mode} but prefix "${config.prefix}" runs in ${recorded} mode (Redis key ${key}) and its idempotency markers are still live (${expiry}). ` +
        `A ${recorded} daemon may still be consuming: a message handled by daemons of both modes can be counted twice in the two-step crash window, ` +
        `the double count atomic mode exists to rule out, and the counters would mix two meanings. ` +
        `Stop every ${recorded} daemon on this prefix and start again once its markers have expired (at most its TALLY_MARKER_TTL_S after its last write), ` +
        `or use a new TALLY_PREFIX.`,
    );
  }
  await redis.hset(key, 'mode', config.mode, 'mode_switched_at', new Date().toISOString());
  return { virtualShards: storedShards, hash: SHARD_HASH, created, mode: config.mode, switchedFrom: recorded };
}
