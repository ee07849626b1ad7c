/**
 * What a scenario that only cuts connections (no daemon is killed) checks
 * after its drain: the counts against the truth, the counters, the overcount
 * bound of a run without crashes (zero), the estimator on the same run, and
 * the dead-letter queue against the workload's bad messages.
 */
import type { DeviationEstimate, TallyConfig } from '@tally/shared';
import type { Workload } from '@tally/workload';
import { countsOf, statsOf, type TestSpace } from '../test/integration/harness.js';
import { checkCounts, checkDeadLetters, estimateRun, overcountBound, unitsPerMessage, type CountCheck, type DeadLetterCheck } from './checks.js';

export interface OutageOutcome {
  readonly check: CountCheck;
  readonly stats: Awaited<ReturnType<typeof statsOf>>;
  readonly units: { mean: number; max: number };
  readonly bound: number;
  readonly estimate: DeviationEstimate;
  readonly dead: DeadLetterCheck;
}

export async function outageOutcome(
  space: TestSpace,
  workload: Workload,
  config: Pick<TallyConfig, 'mode' | 'markerTtlS' | 'batchSize' | 'prefetch' | 'virtualShards'>,
  shape: { readonly maxChanges: number; readonly maxDelta: number },
): Promise<OutageOutcome> {
  const check = checkCounts(await countsOf(space.prefix, config.virtualShards), workload.truth, config.virtualShards);
  const stats = await statsOf(space.prefix);
  const units = unitsPerMessage(workload.truth, workload.good, shape.maxChanges, shape.maxDelta);
  const bound = overcountBound(config, 0, 0, units.max);
  const estimate = estimateRun(stats, config, 0, 'max=1s');
  const dead = await checkDeadLetters(
    space.queue,
    workload.publishes.filter((p) => p.kind === 'bad').map((p) => ({ body: p.body, messageId: p.messageId, codes: new Set([p.reason!]) })),
  );
  return { check, stats, units, bound, estimate, dead };
}
