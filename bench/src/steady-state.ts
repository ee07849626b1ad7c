/**
 * --steady-state: what a drain's `prepare` step does before the drain of a
 * Tally mode: fill the prefix with the marker population the marker TTL
 * holds at the given rate (steady-population.ts, marker-fill.ts) on the
 * server's clock, and record the layout a daemon of that mode would find on
 * such a prefix. Standalone Redis (the bench's private server).
 */
import type { Redis } from 'ioredis';
import { DEFAULTS, defaultBucketWidthS, type TallyMode } from '@tally/shared';
import type { BenchContext } from './context.js';
import { fillMarkers, serverNowS, writeLayout } from './marker-fill.js';
import { sampleMemory } from './redis-nodes.js';
import type { SteadyFillRecord } from './results.js';
import { steadyPopulation } from './steady-population.js';

export interface SteadyPlan {
  readonly mode: TallyMode;
  /** Messages per second the population is that of. */
  readonly rate: number;
  /** Per virtual shard, the workload's parts per message (partsPerMessageByShard). */
  readonly shares: readonly number[];
  readonly seed: number;
}

/** The marker settings the bench's daemons run with: the defaults, or what --tally-env sets. */
export function markerSettings(tallyEnv: Readonly<Record<string, string>>): { markerTtlS: number; bucketWidthS: number; initialSubBuckets: number } {
  const markerTtlS = Number(tallyEnv.TALLY_MARKER_TTL_S ?? DEFAULTS.markerTtlS);
  return {
    markerTtlS,
    bucketWidthS: defaultBucketWidthS(markerTtlS),
    initialSubBuckets: Number(tallyEnv.TALLY_MARKER_SUB_BUCKETS ?? DEFAULTS.markerSubBuckets),
  };
}

export function steadyPrepare(ctx: BenchContext<Redis>, plan: SteadyPlan): (prefix: string) => Promise<Omit<SteadyFillRecord, 'layoutFound'>> {
  return async (prefix) => {
    const settings = markerSettings(ctx.tallyEnv);
    const population = steadyPopulation({
      rate: plan.rate,
      markerTtlS: settings.markerTtlS,
      bucketWidthS: settings.bucketWidthS,
      partsPerMessageByShard: plan.shares,
      nowS: await serverNowS(ctx.redis),
    });
    await writeLayout(ctx.redis, {
      prefix,
      virtualShards: ctx.virtualShards,
      mode: plan.mode,
      bucketS: settings.bucketWidthS,
      subBuckets: settings.initialSubBuckets,
    });
    const before = (await sampleMemory(ctx.nodes)).masters;
    const filled = await fillMarkers(ctx.redis, { prefix, population, seed: plan.seed });
    const after = (await sampleMemory(ctx.nodes)).masters;
    const subs = population.buckets.map((b) => b.subBuckets);
    ctx.log(
      `  steady-state fill of ${prefix}: ${filled.markers.toLocaleString('en')} markers in ${filled.hashes.toLocaleString('en')} hashes, ` +
        `${population.currentBucket - population.oldestBucket + 1} live buckets (the current one ${(population.currentFraction * 100).toFixed(0)}% full), ` +
        `${filled.seconds.toFixed(1)} s, ${((after - before) / 1e6).toFixed(0)} MB`,
    );
    return {
      rate: plan.rate,
      markerTtlS: settings.markerTtlS,
      bucketWidthS: settings.bucketWidthS,
      partsPerMessage: population.partsPerMessage,
      liveBuckets: population.currentBucket - population.oldestBucket + 1,
      currentFraction: population.currentFraction,
      markers: filled.markers,
      hashes: filled.hashes,
      subBuckets: [Math.min(...subs), Math.max(...subs)],
      fillSeconds: filled.seconds,
      fillBytes: after - before,
    };
  };
}
