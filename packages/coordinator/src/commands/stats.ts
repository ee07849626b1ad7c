import type { Redis } from 'ioredis';
import { COUNTER_NAMES, statsKey, type CounterValues, type TallyConfig } from '@tally/shared';

/** The accumulated counters; every known counter is present, 0 when never incremented. */
export async function readStats(redis: Redis, config: Pick<TallyConfig, 'prefix'>): Promise<CounterValues & Record<string, number>> {
  const stored = await redis.hgetall(statsKey(config.prefix));
  const stats: Record<string, number> = {};
  for (const name of COUNTER_NAMES) stats[name] = Number(stored[name] ?? 0);
  for (const [name, value] of Object.entries(stored)) if (!(name in stats)) stats[name] = Number(value);
  return stats as CounterValues & Record<string, number>;
}
