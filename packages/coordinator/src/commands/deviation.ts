/**
 * `tally deviation`: reads the prefix's counters and hands them, with the configuration and the crash
 * pattern from the flags, to the estimator in @tally/shared (deviation.ts).
 */
import type { RedisClient } from '@tally/runtime';
import { CliUsageError, estimateDeviation, formatDeviation, parseRecovery, type DeviationEstimate, type TallyConfig } from '@tally/shared';
import { readStats } from './stats.js';

export interface DeviationFlags {
  readonly 'crashes-per-month'?: string | undefined;
  readonly recovery?: string | undefined;
}

/**
 * `tally deviation`: the expected overcount per month and its bound, from the
 * counters accumulated under TALLY_PREFIX, the configuration (TALLY_MARKER_TTL_S,
 * TALLY_BATCH_SIZE, TALLY_PREFETCH, TALLY_VIRTUAL_SHARDS, TALLY_MODE) and the
 * crash pattern given as flags. The arithmetic is in @tally/shared's deviation.ts.
 */
export async function deviationEstimate(redis: RedisClient, config: TallyConfig, flags: DeviationFlags): Promise<DeviationEstimate> {
  const crashesText = flags['crashes-per-month'];
  if (crashesText === undefined) throw new CliUsageError('deviation needs --crashes-per-month N');
  if (flags.recovery === undefined) throw new CliUsageError('deviation needs --recovery p50=DURATION,p90=DURATION,... (e.g. p50=90s,p90=5m,p99=20m)');
  const crashesPerMonth = Number(crashesText);
  if (crashesText.trim() === '' || !Number.isFinite(crashesPerMonth) || crashesPerMonth < 0) {
    throw new CliUsageError(`--crashes-per-month: expected a number of at least 0, got ${JSON.stringify(crashesText)}`);
  }
  const recovery = parseRecovery(flags.recovery);
  const counters = await readStats(redis, config);
  return estimateDeviation({
    counters,
    config: {
      mode: config.mode,
      source: config.source,
      markerTtlS: config.markerTtlS,
      batchSize: config.batchSize,
      prefetch: config.prefetch,
      virtualShards: config.virtualShards,
    },
    crashesPerMonth,
    recovery,
  });
}

export function deviationText(estimate: DeviationEstimate, prefix: string): string {
  return `deviation estimate for prefix ${prefix}\n${formatDeviation(estimate)}`;
}
