/**
 * `tally stats`: the prefix's accumulated counters from `<prefix>stats`, with its mode.
 */
import type { RedisClient } from '@tally/runtime';
import { COUNTER_NAMES, layoutKey, OPERATOR_COUNTER_NAMES, statsKey, type CounterValues, type TallyConfig, type TallyMode } from '@tally/shared';

/** The accumulated counters; every known counter is present, 0 when never incremented. */
export async function readStats(redis: RedisClient, config: Pick<TallyConfig, 'prefix'>): Promise<CounterValues & Record<string, number>> {
  const stored = await redis.hgetall(statsKey(config.prefix));
  const stats: Record<string, number> = {};
  for (const name of [...COUNTER_NAMES, ...OPERATOR_COUNTER_NAMES]) stats[name] = Number(stored[name] ?? 0);
  for (const [name, value] of Object.entries(stored)) if (!(name in stats)) stats[name] = Number(value);
  return stats as CounterValues & Record<string, number>;
}

/** The mode recorded for the prefix by its daemons; a prefix never laid out, or laid out before modes were recorded, is two-step. */
export async function readMode(redis: RedisClient, config: Pick<TallyConfig, 'prefix'>): Promise<TallyMode> {
  return (await redis.hget(layoutKey(config.prefix), 'mode')) === 'atomic' ? 'atomic' : 'two-step';
}

/**
 * What `tally stats` prints: `mode` first, then every counter as a number,
 * except that in atomic mode `occupation_failures` is null. It cannot happen
 * there (counts and markers are written by one script), and a 0 would read
 * as "the crash window never fired" rather than "there is none". A prefix
 * switched from two-step keeps the failures of its two-step past, under
 * `occupation_failures_two_step` when there were any.
 */
export type StatsReport = { mode: TallyMode | 'stream' } & Record<string, number | null | TallyMode | 'stream'>;

/** `stream` for a stream source's prefix (TALLY_SOURCE=stream): it has no mode, and no crash window either. */
export function statsReport(mode: TallyMode | 'stream', counters: Record<string, number>): StatsReport {
  const report: StatsReport = { mode };
  for (const [name, value] of Object.entries(counters)) report[name] = value;
  if (mode === 'stream') report.occupation_failures = null;
  if (mode === 'atomic') {
    const past = counters.occupation_failures ?? 0;
    report.occupation_failures = null;
    if (past > 0) report.occupation_failures_two_step = past;
  }
  return report;
}

export async function readStatsReport(redis: RedisClient, config: Pick<TallyConfig, 'prefix'> & Partial<Pick<TallyConfig, 'source'>>): Promise<StatsReport> {
  return statsReport(config.source === 'stream' ? 'stream' : await readMode(redis, config), await readStats(redis, config));
}

/**
 * The table `tally stats` prints: one line per entry, values in one column
 * whatever the longest counter name (counters are added over time).
 */
export function statsText(report: StatsReport): string {
  const entries = Object.entries(report);
  const width = Math.max(...entries.map(([name]) => name.length));
  return entries
    .map(([name, value]) => {
      const shown =
        value === null && name === 'occupation_failures'
          ? report.mode === 'stream'
            ? 'n/a (a stream: no markers, no crash window)'
            : 'n/a (atomic mode: counts and markers are written in one step)'
          : String(value);
      return `${name.padEnd(width)}  ${shown}`;
    })
    .join('\n');
}
