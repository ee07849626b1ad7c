/**
 * --steady-state: what a drain's `prepare` step does before the drain of a
 * Tally mode: fill the prefix with the marker population the marker TTL
 * holds at the given rate (steady-population.ts, marker-fill.ts) on the
 * server's clock, and record the layout a daemon of that mode would find on
 * such a prefix, on the bench's private standalone server or its private
 * cluster (--scale-out --redis-figures: every master).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import {
  DEFAULTS,
  messageMarkerShards,
  defaultBucketWidthS,
  defaultMarkerScope,
  filterBitsOfFormat,
  markerFormatOf,
  needsFencedAdoption,
  markersPerSubBucket,
  type Change,
  type MarkerScope,
  type TallyMode,
} from '@tally/shared';
import type { Workload } from '@tally/workload';
import type { AnyBenchContext } from './context.js';
import { fillBatchedMarkers } from './batched-fill.js';
import { fillMarkers, serverNowS, writeLayout } from './marker-fill.js';
import { fillReceipts } from './receipt-fill.js';
import { sampleMemory } from './redis-nodes.js';
import type { SteadyFillRecord } from './results.js';
import { partsPerMessageByShard, steadyPopulation } from './steady-population.js';

export interface SteadyPlan {
  readonly mode: TallyMode;
  /** Messages per second the population is that of. */
  readonly rate: number;
  /** Per virtual shard, the markers one message leaves (steadyShares). */
  readonly shares: readonly number[];
  /** Per virtual shard, the parts per message its counts get (steadyCountShares): the write receipts of counts written per slot. */
  readonly countShares: readonly number[];
  readonly seed: number;
  /** Seconds the drain after the fill may take: the fill waits for the next bucket if the current one ends sooner. */
  readonly drainBudgetS: number;
  /** How full to fill the bucket of now (--steady-phase), or null: its elapsed fraction. */
  readonly phase?: number | null;
}

/** Server seconds per filled marker (measured 0.7 to 0.95 µs on a loaded 2-core machine). */
const FILL_S_PER_MARKER = 1e-6;

/**
 * Seconds to wait before filling so that the fill and the drain fall in one
 * bucket: when the bucket of now ends before they would be done, its end
 * (the oldest live bucket expires then, and the daemon opens a new one
 * mid-drain), else 0. Never more than half a bucket: a drain longer than
 * that crosses a boundary anyway.
 */
export function waitForBucketS(nowS: number, bucketWidthS: number, needS: number): number {
  const leftS = bucketWidthS - (nowS % bucketWidthS);
  return leftS < needS && needS < bucketWidthS / 2 ? leftS + 0.5 : 0;
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

/** The batching the bench's daemons run with: the defaults, or what --tally-env sets. */
export function batchSettings(tallyEnv: Readonly<Record<string, string>>): { batchSize: number; batchWaitMs: number } {
  return {
    batchSize: Number(tallyEnv.TALLY_BATCH_SIZE ?? DEFAULTS.batchSize),
    batchWaitMs: Number(tallyEnv.TALLY_BATCH_WAIT_MS ?? DEFAULTS.batchWaitMs),
  };
}

/** The marker scope the bench's daemons lay a new prefix out with: --tally-env TALLY_MARKER_SCOPE, else the daemon's default for the topology. */
export function benchMarkerScope(tallyEnv: Readonly<Record<string, string>>, topology: 'standalone' | 'cluster', mode: TallyMode): MarkerScope {
  const set = tallyEnv.TALLY_MARKER_SCOPE?.trim();
  if (set === 'message' || set === 'part') return set;
  return defaultMarkerScope(topology, mode);
}

/**
 * Per virtual shard, the markers one message leaves: the workload's parts
 * per message on each shard for part-scoped markers (the population has the
 * workload's spread), one per message spread evenly by digest over the
 * marker shards for message-scoped ones.
 */
export function steadyShares(ctx: AnyBenchContext, mode: TallyMode, workload: Workload): number[] {
  if (benchMarkerScope(ctx.tallyEnv, ctx.nodes.topology, mode) === 'message') {
    const shards = messageMarkerShards(ctx.virtualShards);
    return Array.from({ length: ctx.virtualShards }, (_, vshard) => (vshard < shards ? 1 / shards : 0));
  }
  return steadyCountShares(ctx, workload);
}

/** Per virtual shard, the workload's parts per message: each shard's count batches, whatever the marker scope. */
export function steadyCountShares(ctx: AnyBenchContext, workload: Workload): number[] {
  return partsPerMessageByShard(
    workload.publishes.filter((p) => p.kind === 'good').map((p) => (JSON.parse(p.body.toString('utf8')) as { changes: Change[] }).changes),
    ctx.virtualShards,
  );
}

export function steadyPrepare(ctx: AnyBenchContext, plan: SteadyPlan): (prefix: string) => Promise<Omit<SteadyFillRecord, 'layoutFound'>> {
  return async (prefix) => {
    const settings = markerSettings(ctx.tallyEnv);
    const scope = benchMarkerScope(ctx.tallyEnv, ctx.nodes.topology, plan.mode);
    // As the daemon lays a new prefix out (open-fleet.ts): atomic's message scope on a cluster has fenced adoption.
    const format = markerFormatOf(scope, needsFencedAdoption(ctx.nodes.topology, plan.mode, 'queue'));
    const filterBits = filterBitsOfFormat(format);
    const populationAt = (nowS: number) =>
      steadyPopulation({
        rate: plan.rate,
        markerTtlS: settings.markerTtlS,
        bucketWidthS: settings.bucketWidthS,
        partsPerMessageByShard: plan.shares,
        nowS,
        markersPerHash: markersPerSubBucket(filterBits),
        currentFraction: plan.phase ?? null,
      });
    let nowS = await serverNowS(ctx.redis);
    const waitS = waitForBucketS(nowS, settings.bucketWidthS, populationAt(nowS).totalMarkers * FILL_S_PER_MARKER + plan.drainBudgetS);
    if (waitS > 0) {
      ctx.log(`  steady state: the current marker bucket ends in ${waitS.toFixed(0)} s, before the fill and the drain would; waiting for the next one`);
      await sleep(waitS * 1000);
      nowS = await serverNowS(ctx.redis);
    }
    const population = populationAt(nowS);
    await writeLayout(ctx.redis, {
      prefix,
      virtualShards: ctx.virtualShards,
      mode: plan.mode,
      bucketS: settings.bucketWidthS,
      subBuckets: settings.initialSubBuckets,
      format,
    });
    const before = (await sampleMemory(ctx.nodes)).masters;
    const filled = await fillMarkers(ctx.redis, {
      prefix,
      population,
      seed: plan.seed,
      filterBits,
    });
    const batching = batchSettings(ctx.tallyEnv);
    // Message-scoped markers on a cluster write counts per slot, a receipt in each count shard a batch touches.
    const perSlotCounts = scope === 'message' && ctx.nodes.topology === 'cluster';
    const receipts = await fillReceipts(ctx.redis, {
      prefix,
      rate: plan.rate,
      laneShares: plan.shares,
      ...(perSlotCounts ? { countShares: plan.countShares } : {}),
      ...batching,
      markerTtlS: settings.markerTtlS,
    });
    const after = (await sampleMemory(ctx.nodes)).masters;
    const subs = population.buckets.map((b) => b.subBuckets);
    ctx.log(
      `  steady-state fill of ${prefix}: ${filled.markers.toLocaleString('en')} markers in ${filled.hashes.toLocaleString('en')} hashes, ` +
        `${population.currentBucket - population.oldestBucket + 1} live buckets (the current one ${(population.currentFraction * 100).toFixed(0)}% full), ` +
        `${receipts.toLocaleString('en')} write receipts, ` +
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
      receipts,
      hashes: filled.hashes,
      subBuckets: [Math.min(...subs), Math.max(...subs)],
      fillSeconds: filled.seconds,
      fillBytes: after - before,
    };
  };
}

/**
 * The hand-written batched consumer's steady state (batched-fill.ts): the
 * rate × TTL marker keys its Redis holds in production, expiring during the
 * drain, so the reference runs at steady state like Tally.
 */
export function batchedSteadyPrepare(ctx: AnyBenchContext, rate: number): (prefix: string) => Promise<Omit<SteadyFillRecord, 'layoutFound'>> {
  return async (prefix) => {
    const markerTtlS = markerSettings(ctx.tallyEnv).markerTtlS;
    const before = (await sampleMemory(ctx.nodes)).masters;
    const fill = await fillBatchedMarkers(ctx.redis, prefix, rate, markerTtlS);
    const after = (await sampleMemory(ctx.nodes)).masters;
    ctx.log(
      `  steady-state fill of ${prefix}: ${fill.markers.toLocaleString('en')} SET … EX keys in ${fill.fillSeconds.toFixed(1)} s, ${((after - before) / 1e6).toFixed(0)} MB; ` +
        (fill.overrunSeconds > 0
          ? `${fill.overrunSeconds.toFixed(1)} s past its planned end: about ${((fill.overrunSeconds / markerTtlS) * 100).toFixed(1)} % of the keys expired during it`
          : `waited ${fill.waitSeconds.toFixed(1)} s for its planned end, so that none expired during it`),
    );
    return {
      rate,
      markerTtlS,
      bucketWidthS: markerTtlS,
      partsPerMessage: 1,
      liveBuckets: 1,
      currentFraction: 1,
      markers: fill.markers,
      hashes: 0,
      subBuckets: [0, 0],
      fillSeconds: fill.fillSeconds,
      fillBytes: after - before,
    };
  };
}
