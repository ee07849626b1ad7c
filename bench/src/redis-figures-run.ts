/**
 * The Redis figures of `pnpm bench --scale-out` (`--redis-figures`; always in
 * the full run): the drain of `pnpm bench` (drain.ts) by the ceiling, Tally
 * two-step and Tally atomic on the scale-out run's standalone Redis and on
 * its cluster, so that Redis memory and CPU per message compare across
 * topologies within one run. A cluster's figures are its masters summed
 * (every write lands on a master), its replicas reported apart.
 *
 *   per topology: the servers' CPU over IDLE_SECONDS with no drain (their fixed cost)
 *   for each round, for each topology (order rotated by round):
 *     ceiling, batched, two-step, atomic (order rotated by round), each a runDrain with marker memory measured
 *     with --steady-state: batched and each Tally mode again on a prefix filled with the marker
 *       population of the steady rate (steady-state.ts), on that topology's servers
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Workload } from '@tally/workload';
import type { AnyBenchContext } from './context.js';
import { runDrain } from './drain.js';
import { isTally } from './contenders.js';
import { readsStream } from './results.js';
import { batchedSteadyPrepare, steadyCountShares, steadyPrepare, steadyShares } from './steady-state.js';
import { FIGURE_CONTENDERS, type IdleCpu, type TopologyDrain, type TopologyName } from './redis-figures.js';
import { sampleCpu } from './redis-nodes.js';
import { roundOrder } from './run-bench.js';

const IDLE_SECONDS = 5;

export interface FigureTopology {
  readonly name: TopologyName;
  readonly ctx: AnyBenchContext;
}

async function idleCpu(topology: FigureTopology): Promise<IdleCpu> {
  const before = await sampleCpu(topology.ctx.nodes);
  const started = performance.now();
  await sleep(IDLE_SECONDS * 1_000);
  const after = await sampleCpu(topology.ctx.nodes);
  return {
    topology: topology.name,
    seconds: (performance.now() - started) / 1_000,
    mastersCpuSeconds: after.masters - before.masters,
    replicasCpuSeconds: after.replicas === null || before.replicas === null ? null : after.replicas - before.replicas,
  };
}

/** --steady-state: the rate whose marker population is filled before each steady drain, and the fill's seed. */
export interface FigureSteadyState {
  readonly rate: number;
  readonly seed: number;
  /** --steady-phase, or null: the clock's. */
  readonly phase?: number | null;
}

/** The figures' contenders that drain again at steady state: those with markers (a stream has none), the hand-written reference included. */
const STEADY_FIGURE_CONTENDERS = FIGURE_CONTENDERS.filter((c) => (isTally(c) && !readsStream(c)) || c === 'batched');

export async function runRedisFigures(
  topologies: readonly FigureTopology[],
  workload: Workload,
  rounds: number,
  log: (line: string) => void,
  steady: FigureSteadyState | null = null,
  /**
   * Drained first by every contender, outside the measured window (--warmup): without it a short drain pays its
   * one-time costs (script loads, a steady prefix's settled filters copied into the thread, shapes learned) per message.
   */
  warmup?: Workload,
): Promise<{ drains: TopologyDrain[]; idle: IdleCpu[] }> {
  const idle: IdleCpu[] = [];
  for (const topology of topologies) {
    const sample = await idleCpu(topology);
    idle.push(sample);
    log(`  idle ${topology.name}: servers' CPU ${((sample.mastersCpuSeconds * 1e3) / sample.seconds).toFixed(1)} ms/s over ${sample.seconds.toFixed(1)} s`);
  }
  // The workload's count parts per shard, parsed once per topology rather than once per steady drain.
  const countSharesOf = new Map(topologies.map((topology) => [topology, steady === null ? [] : steadyCountShares(topology.ctx, workload)]));
  const drains: TopologyDrain[] = [];
  for (let round = 0; round < rounds; round++) {
    for (const topology of roundOrder(topologies, round)) {
      const runs = [
        ...roundOrder(FIGURE_CONTENDERS, round).map((contender) => ({ contender, steady: false })),
        ...(steady === null ? [] : roundOrder(STEADY_FIGURE_CONTENDERS, round).map((contender) => ({ contender, steady: true }))),
      ];
      for (const { contender, steady: atSteadyState } of runs) {
        const mode = contender === 'tally-atomic' ? 'atomic' : 'two-step';
        const { record, memory } = await runDrain(topology.ctx, {
          contender,
          round,
          label: `${topology.name}.${atSteadyState ? 'ss' : 'r'}${round}`,
          workload,
          ...(warmup ? { warmup } : {}),
          measureMarkers: !atSteadyState,
          ...(atSteadyState && steady !== null
            ? {
                variant: 'steady' as const,
                prepare:
                  contender === 'batched'
                    ? batchedSteadyPrepare(topology.ctx, steady.rate)
                    : steadyPrepare(topology.ctx, {
                        mode,
                        rate: steady.rate,
                        shares: steadyShares(topology.ctx, mode, workload),
                        countShares: countSharesOf.get(topology)!,
                        seed: steady.seed + round,
                        // At 3,000 msg/s, plus the preload and the stop (as run-bench.ts plans it).
                        drainBudgetS: (workload.publishes.length + (warmup?.publishes.length ?? 0)) / 3_000 + 15,
                        phase: steady.phase ?? null,
                      }),
              }
            : {}),
        });
        drains.push({ topology: topology.name, record, ...(memory ? { marker: memory } : {}) });
        const perMessage = (value: number | null, scale = 1) => (value === null ? 'n/a' : ((value * scale) / record.messages).toFixed(1));
        const masters = record.cluster ? ` (per master ${record.cluster.perMasterMemoryBytes.map((b) => Math.round(b / record.messages)).join(' / ')})` : '';
        const replicas = record.cluster
          ? `, replicas ${(record.cluster.replicaMemoryBytes / record.messages).toFixed(0)} B + ${((record.cluster.replicaCpuSeconds * 1e6) / record.messages).toFixed(1)} µs`
          : '';
        log(
          `  round ${round + 1} ${topology.name.padEnd(10)} ${(atSteadyState ? `${contender} steady` : contender).padEnd(21)} ${Number.isFinite(record.msgPerSec) ? `${Math.round(record.msgPerSec)} msg/s` : 'no rate'}  ` +
            `daemon ${perMessage(record.cpuSeconds, 1e6)} µs, Redis ${perMessage(record.redisCpuSeconds, 1e6)} µs + ${perMessage(record.redisMemoryBytes)} B${masters} per msg${replicas}  ` +
            `${record.correct ? 'correct' : `PROBLEM: ${record.problem}`}`,
        );
      }
    }
  }
  return { drains, idle };
}
