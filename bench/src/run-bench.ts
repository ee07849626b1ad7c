/**
 * The bench's plan: rounds of drains (contenders alternating, the order
 * rotated each round), a latency run at half the ceiling's rate in every
 * round, then the load sweep and the parameter sweeps, then the summary.
 * Failures are recorded, never thrown past a run: one broken contender must
 * not hide the others' figures.
 */
import { cpus } from 'node:os';
import { Redis } from 'ioredis';
import { benchContext } from './context.js';
import { isTally } from './contenders.js';
import { startTraceSink } from './trace-sink.js';
import { runDrain } from './drain.js';
import { runLatency } from './latency-run.js';
import { runMarkerTtlSweep } from './marker-ttl-sweep.js';
import { workloadShape, type BenchOptions } from './options.js';
import { parseInfo } from '@tally/shared';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import {
  readsStream,
  summarize,
  type BenchResults,
  type DrainRecord,
  type LatencyRecord,
  type MarkerMemoryRecord,
  type MarkerTtlRecord,
  type SweepRecord,
} from './results.js';
import { median } from './stats.js';
import { batchedSteadyPrepare, steadyCountShares, steadyPrepare, steadyShares } from './steady-state.js';
import type { TallyMode } from '@tally/shared';
import { generateWorkload, type Workload, type WorkloadOptions } from '@tally/workload';
import { BENCH_SERVER_ARGS } from './redis-nodes.js';

/** Rotates the contender order by the round, so no contender always runs first (or right after the broker's preload). */
export function roundOrder<T>(items: readonly T[], round: number): T[] {
  if (items.length === 0) return [];
  const shift = round % items.length;
  return [...items.slice(shift), ...items.slice(0, shift)];
}

export interface BenchRun {
  readonly results: BenchResults;
  /** Non-zero when a contender failed to start, failed to run or miscounted. */
  readonly exitCode: number;
}

export async function runBench(options: BenchOptions, log: (line: string) => void): Promise<BenchRun> {
  const startedAt = new Date().toISOString();
  let server: PrivateRedis | null = null;
  let redisUrl = options.redisUrl;
  if (redisUrl === null) {
    server = await startPrivateRedis({ args: BENCH_SERVER_ARGS });
    redisUrl = server.url;
    log(`private redis-server ${server.version} on ${server.url} (pid ${server.pid})`);
  }
  const redis = new Redis(redisUrl, { connectionName: 'tally-bench' });
  const traceSink = await startTraceSink();
  const ctx = benchContext(options, {
    redisUrl,
    redisPrivate: server !== null,
    redis,
    runId: `${Date.now().toString(36)}${process.pid.toString(36)}`,
    traceSinkUrl: traceSink.url,
    log,
  });
  const drains: DrainRecord[] = [];
  const latencies: LatencyRecord[] = [];
  const memory: MarkerMemoryRecord[] = [];
  const sweeps: SweepRecord[] = [];
  const problems: string[] = [];
  try {
    const redisVersion = parseInfo(await redis.info('server')).get('redis_version') ?? 'unknown';
    const workloadOptions: Partial<WorkloadOptions> = { ...workloadShape(options), badRate: 0, idPrefix: 'bench' };
    // Every contender asked for runs: one that cannot start is a failed run (exit 1), never skipped.
    const contenders = options.contenders;
    const workload = generateWorkload(workloadOptions);
    log(
      `workload: ${workload.publishes.length} deliveries (${workload.good} messages + ${workload.duplicates} duplicates), ${workload.truth.size} SKUs counted`,
    );
    // Drained first by every contender, from the same queue: its own ids and seed, the same shape.
    const warmup =
      options.warmupMessages > 0
        ? generateWorkload({ ...workloadOptions, messages: options.warmupMessages, seed: options.seed + 7_919, idPrefix: 'warm' })
        : undefined;
    if (warmup) log(`warm-up: ${warmup.publishes.length} deliveries drained by every contender before its measured window`);
    const sharesOf = (mode: TallyMode): number[] => (options.steadyState ? steadyShares(ctx, mode, workload) : []);
    const countShares = options.steadyState ? steadyCountShares(ctx, workload) : [];
    const shares = sharesOf('two-step');
    if (options.steadyState)
      log(
        `steady state: the population of ${options.steadyRate} msg/s × ${shares.reduce((a, b) => a + b, 0).toFixed(2)} parts per message over the live buckets, filled before each Tally mode's steady drain`,
      );

    const record = (r: DrainRecord) => {
      drains.push(r);
      const rate = Number.isFinite(r.msgPerSec) ? `${Math.round(r.msgPerSec)} msg/s` : 'no rate';
      const warm = r.warmup ? `  (warm-up ${r.warmup.seconds.toFixed(2)} s, ${Math.round(r.warmup.msgPerSec)} msg/s)` : '';
      log(
        `  ${r.contender.padEnd(15)}${r.variant === 'steady' ? ' steady' : ''} ${rate.padStart(12)}  ${r.seconds.toFixed(2)} s  cpu ${r.cpuSeconds.toFixed(2)} s${warm}  ${r.correct ? 'correct' : `PROBLEM: ${r.problem}`}`,
      );
      if (!r.correct) problems.push(`round ${r.round + 1}, ${r.contender}: ${r.problem}`);
    };
    const recordLatency = (l: LatencyRecord) => {
      latencies.push(l);
      log(
        `  ${l.contender.padEnd(15)} load ${l.loadFraction} (${Math.round(l.achievedRate)} msg/s): p50 ${l.p50Ms.toFixed(1)} ms, p99 ${l.p99Ms.toFixed(1)} ms (${l.samples} samples, ${l.method})${l.correct ? '' : ` PROBLEM: ${l.problem}`}`,
      );
      if (!l.correct) problems.push(`latency ${l.loadFraction} ${l.contender}: ${l.problem}`);
    };
    const latencyWorkload = (rate: number, seed: number): Workload =>
      generateWorkload({
        ...workloadOptions,
        messages: Math.max(100, Math.round(rate * (options.latencySeconds + warmupMs / 1000))),
        duplicateRate: 0,
        seed,
        idPrefix: 'lat',
      });
    const warmupMs = options.quick ? 500 : 1_000;
    // Latency runs and the sweeps publish into queues: the stream contenders are measured by their drains. A quick
    // run (CI's) leaves out naive too: at half the ceiling's rate it is overloaded, and waited 11 s for a backlog.
    const latencyContenders = contenders.filter((c) => !readsStream(c) && !(options.quick && c === 'naive'));
    if (options.quick && contenders.includes('naive')) log('quick run: naive drains, but has no latency run (overloaded at half the ceiling)');
    const ceilingRates: number[] = [];
    const fallbackRate = () => median(ceilingRates) || 5_000;

    for (let round = 0; round < options.rounds; round++) {
      log(`round ${round + 1}/${options.rounds}: drains`);
      for (const contender of roundOrder(contenders, round)) {
        const outcome = await runDrain(ctx, { contender, round, label: `r${round}`, workload, measureMarkers: true, ...(warmup ? { warmup } : {}) });
        record(outcome.record);
        if (outcome.memory) memory.push(outcome.memory);
        if (contender === 'ceiling' && outcome.record.correct) ceilingRates.push(outcome.record.msgPerSec);
      }
      if (options.steadyState) {
        log(`round ${round + 1}/${options.rounds}: steady-state drains`);
        // The hand-written consumer too, on its own marker population; a stream has none (its fresh drain is its steady one).
        const steadyContenders = contenders.filter((c) => (isTally(c) && c !== 'tally-stream') || c === 'batched');
        for (const contender of roundOrder(steadyContenders, round)) {
          const mode: TallyMode = contender === 'tally-atomic' ? 'atomic' : 'two-step';
          const outcome = await runDrain(ctx, {
            contender,
            round,
            label: `ss${round}`,
            workload,
            variant: 'steady',
            prepare:
              contender === 'batched'
                ? batchedSteadyPrepare(ctx, options.steadyRate)
                : steadyPrepare(ctx, {
                    mode,
                    rate: options.steadyRate,
                    shares: sharesOf(mode),
                    countShares,
                    seed: options.seed + round,
                    // At 3,000 msg/s (below what a steady-state drain here has done), plus the preload and the stop.
                    drainBudgetS: (workload.publishes.length + (warmup?.publishes.length ?? 0)) / 3_000 + 15,
                    phase: options.steadyPhase,
                  }),
            ...(warmup ? { warmup } : {}),
          });
          record(outcome.record);
        }
      }
      if (options.steadyState) continue;
      const thisCeiling = drains.find((d) => d.round === round && d.contender === 'ceiling' && d.correct)?.msgPerSec ?? fallbackRate();
      const rate = Math.round(thisCeiling / 2);
      log(`round ${round + 1}/${options.rounds}: latency at half the ceiling's rate (${rate} msg/s)`);
      for (const contender of roundOrder(latencyContenders, round)) {
        recordLatency(
          await runLatency(ctx, { contender, round, label: `l${round}`, loadFraction: 0.5, rate, warmupMs, workload: latencyWorkload(rate, 100 + round) }),
        );
      }
    }

    const ceiling = fallbackRate();
    const sweepLoads = options.loads.filter((f) => f !== 0.5 || options.rounds === 0);
    if (sweepLoads.length > 0) log(`load sweep at ${sweepLoads.join(', ')} × ${Math.round(ceiling)} msg/s`);
    for (const fraction of sweepLoads) {
      const rate = Math.round(ceiling * fraction);
      for (const contender of latencyContenders) {
        recordLatency(
          await runLatency(ctx, {
            contender,
            round: null,
            label: `load${fraction}`,
            loadFraction: fraction,
            rate,
            warmupMs,
            workload: latencyWorkload(rate, 200),
          }),
        );
      }
    }

    // Parameter sweeps: each point pairs a ceiling drain with the Tally drains of the same workload.
    const tallies = contenders.filter((c) => isTally(c) && !readsStream(c));
    const sweepWorkload = (range?: readonly [number, number]) =>
      generateWorkload({ ...workloadOptions, messages: options.sweepMessages, ...(range ? { minChanges: range[0], maxChanges: range[1] } : {}) });
    const points: Array<{ sweep: SweepRecord['sweep']; label: string; x: number; workload: Workload; env: Record<string, string> }> = [];
    const base = options.sweeps.length > 0 ? sweepWorkload() : null;
    if (base && options.sweeps.includes('batch-size'))
      for (const b of options.batchSizes)
        points.push({ sweep: 'batch-size', label: `TALLY_BATCH_SIZE=${b}`, x: b, workload: base, env: { TALLY_BATCH_SIZE: String(b) } });
    if (base && options.sweeps.includes('workers'))
      for (const w of options.workerCounts)
        points.push({ sweep: 'workers', label: `TALLY_WORKERS=${w}`, x: w, workload: base, env: { TALLY_WORKERS: String(w) } });
    if (options.sweeps.includes('changes')) {
      for (const r of options.changeRanges)
        points.push({ sweep: 'changes', label: `${r[0]}-${r[1]} SKUs/msg`, x: (r[0] + r[1]) / 2, workload: sweepWorkload(r), env: {} });
    }
    for (const [i, point] of points.entries()) {
      log(`sweep ${point.sweep}: ${point.label}`);
      const paired = await runDrain(ctx, { contender: 'ceiling', round: -1, label: `s${i}`, workload: point.workload });
      record(paired.record);
      for (const contender of tallies) {
        const outcome = await runDrain(ctx, { contender, round: -1, label: `s${i}`, workload: point.workload, tallyEnv: point.env });
        record(outcome.record);
        sweeps.push({
          sweep: point.sweep,
          label: point.label,
          x: point.x,
          contender,
          msgPerSec: outcome.record.msgPerSec,
          ceilingMsgPerSec: paired.record.msgPerSec,
          ratioToCeiling: outcome.record.msgPerSec / paired.record.msgPerSec,
          correct: outcome.record.correct && paired.record.correct,
        });
      }
    }

    let markerTtl: MarkerTtlRecord[] = [];
    if (options.markerTtls.length > 0 && contenders.includes('tally-two-step')) {
      log(`marker TTL sweep: ${options.markerTtls.join(', ')} s at ${options.markerTtlRate} msg/s`);
      markerTtl = await runMarkerTtlSweep(ctx, { ttls: options.markerTtls, rate: options.markerTtlRate, workload: workloadOptions });
      for (const r of markerTtl) if (r.problem) problems.push(`marker TTL sweep ${r.ttlS} s: ${r.problem}`);
    }

    // Rounds are 0-based; sweep drains use round -1 and stay out of the medians.
    const summary = summarize(
      contenders,
      drains.filter((d) => d.round >= 0),
      latencies,
      memory,
      options.rounds,
    );
    for (const s of summary) if (s.rounds === 0 && options.rounds > 0) problems.push(`${s.contender} did not run`);
    const results: BenchResults = {
      version: 1,
      startedAt,
      finishedAt: new Date().toISOString(),
      quick: options.quick,
      steadyState: options.steadyState,
      machine: { cpus: cpus().length, node: process.versions.node, redis: `${redisVersion}${ctx.redisPrivate ? '' : ' (shared: command counts approximate)'}` },
      options: {
        workload: {
          messages: options.messages,
          skus: options.skus,
          zipf: options.zipf,
          changes: `${options.minChanges}-${options.maxChanges}`,
          duplicateRate: options.duplicateRate,
          seed: options.seed,
        },
        prefetch: options.prefetch,
        tallyEnv: options.tallyEnv,
        warmupMessages: options.warmupMessages,
        ...(options.steadyState ? { steadyRate: options.steadyRate, steadyPhase: options.steadyPhase } : {}),
        ackEvery: options.ackEvery,
        ackWaitMs: options.ackWaitMs,
        latencySeconds: options.latencySeconds,
        loads: options.loads,
        sweeps: options.sweeps,
        sweepMessages: options.sweepMessages,
      },
      rounds: options.rounds,
      summary,
      drains,
      latencies,
      markerMemory: memory,
      markerTtl,
      sweeps,
      problems,
    };
    const failed = summary.some((s) => !s.correct) || problems.length > 0;
    return { results, exitCode: failed ? 1 : 0 };
  } finally {
    if (traceSink.requests() > 0) log(`trace sink: ${traceSink.requests()} OTLP exports, ${(traceSink.bytes() / 1e6).toFixed(1)} MB of spans`);
    await traceSink.close();
    redis.disconnect();
    await server?.stop();
  }
}
