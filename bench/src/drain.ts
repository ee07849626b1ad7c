/**
 * One throughput measurement: preload a queue with a warm-up load and then
 * the workload, drain it with one contender, measure, then check that it
 * counted correctly.
 *
 *   reset -> [prepare: the steady-state fill] -> publish warm-up + workload (confirms) -> start contender
 *         -> warm (its own report: the warm-up acked) -> [clock starts; CPU, Redis CPU and commands read]
 *         -> done (its own report: every delivery acked) -> [clock stops; read again] -> SIGTERM -> verify
 *
 * The consumers report `warm` and `done` on stdout; the daemon is read at
 * its /metrics (tally-progress.ts watchDaemon), never through Redis, so
 * Redis's figures over the window are the contender's alone. The warm-up
 * (JIT, connections, the first batches) stays out of the window and is
 * reported apart; without one the clock starts when the contender consumes.
 *
 * The Redis figures are read from every server the context names: the one
 * standalone server, or a Redis Cluster's masters summed (its replicas apart).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { escapeGlob } from '@tally/shared';
import { readCounts } from '@tally/coordinator/counts';
import { freePort, resetNamespace } from '@tally/testkit';
import { compareWithTruth, describeTruthCheck, publishAll, type Workload } from '@tally/workload';
import type { AnyBenchContext } from './context.js';
import { contextRunFields, prefixName, queueName } from './context.js';
import { isTally, startContender, type RunningContender } from './contenders.js';
import { cpuSeconds, peakRssBytes, threadCpuSeconds } from './proc.js';
import { callsDelta, perNodeDelta, sumValues } from './redis-info.js';
import {
  flushMasters,
  sampleCommands,
  sampleCpu,
  sampleErrors,
  sampleMemory,
  settleReplicas,
  waitForLazyFree,
  waitForRehash,
  type RedisNodes,
} from './redis-nodes.js';
import {
  readsStream,
  type ContenderName,
  type DrainRecord,
  type DrainVariant,
  type MarkerMemoryRecord,
  type SteadyFillRecord,
  type WarmupFigures,
} from './results.js';
import { partsPerBatch } from './daemon-metrics.js';
import { watchDaemon } from './tally-progress.js';
import { queueState } from './broker.js';

export interface DrainPlan {
  readonly contender: ContenderName;
  readonly round: number;
  /** Distinguishes the queue and prefix of this run (e.g. `r1`, `batch-50`). */
  readonly label: string;
  readonly workload: Workload;
  readonly tallyEnv?: Readonly<Record<string, string>>;
  readonly nodeArgs?: readonly string[];
  /** Measure marker memory afterwards (deletes the markers). */
  readonly measureMarkers?: boolean;
  /** Drained first, from the same queue into the same prefix, outside the measured window. */
  readonly warmup?: Workload;
  readonly variant?: DrainVariant;
  /**
   * Runs after the reset, before the memory baseline and the preload: the
   * steady-state fill of the prefix (run-bench.ts); it reports what it
   * filled, completed by the drain with whether the daemon found the layout.
   */
  readonly prepare?: (prefix: string) => Promise<Omit<SteadyFillRecord, 'layoutFound'>>;
}

/** Two truths added SKU by SKU: what the prefix must hold after the warm-up and the workload. */
export function mergeTruths(a: ReadonlyMap<string, number>, b: ReadonlyMap<string, number>): Map<string, number> {
  const merged = new Map(a);
  for (const [sku, n] of b) merged.set(sku, (merged.get(sku) ?? 0) + n);
  for (const [sku, n] of merged) if (n === 0) merged.delete(sku);
  return merged;
}

/** What the window's ends read: the contender's CPU (all threads, the main thread alone), Redis's CPU and commands. */
interface WindowSample {
  readonly cpu: number;
  readonly mainCpu: number;
  readonly redisCpu: { readonly masters: number; readonly replicas: number | null } | null;
  readonly commands: Map<string, number>;
  readonly commandUsec: Map<string, number>;
}

export interface DrainOutcome {
  readonly record: DrainRecord;
  readonly memory?: MarkerMemoryRecord;
}

/**
 * Clean slate for a run: the bench's own queue, and its prefix (or the whole
 * private Redis: every master of a private cluster), freed before the next
 * run measures anything (waitForLazyFree).
 */
export async function resetSpace(ctx: AnyBenchContext, queue: string, prefix: string): Promise<void> {
  await resetNamespace({ amqpUrl: ctx.amqpUrl, redisUrl: ctx.redisUrl, queue, prefix });
  if (ctx.redisPrivate) await flushMasters(ctx.nodes);
  await waitForLazyFree(ctx.nodes);
}

/** Keys matching a pattern on one server (SCAN, never KEYS). */
async function scanKeys(redis: RedisNodes['masters'][number], pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 2000);
    cursor = next;
    found.push(...keys);
  } while (cursor !== '0');
  return found;
}

/**
 * Bytes one marker costs: delete every marker of the run and see how much
 * used_memory drops (summed over a cluster's masters). Measured on a private
 * Redis only, where nothing else allocates meanwhile; the keys' expiry
 * entries are included, as they should be. Keys are deleted one per DEL: on
 * a cluster node a multi-key DEL must stay within one slot.
 */
export async function measureMarkerMemory(ctx: AnyBenchContext, pattern: string): Promise<{ markers: number; bytes: number } | null> {
  if (!ctx.redisPrivate) return null;
  const perServer = await Promise.all(ctx.nodes.masters.map(async (server) => ({ server, keys: await scanKeys(server, pattern) })));
  if (perServer.every(({ keys }) => keys.length === 0)) return null;
  // A marker hash holds many markers (its fields); a marker key is one.
  let markers = 0;
  for (const { server, keys } of perServer) {
    for (let i = 0; i < keys.length; i += 1_000) {
      const pipeline = server.pipeline();
      for (const key of keys.slice(i, i + 1_000)) pipeline.type(key);
      const types = (await pipeline.exec()) ?? [];
      const lengths = server.pipeline();
      keys.slice(i, i + 1_000).forEach((key, j) => (types[j]?.[1] === 'hash' ? lengths.hlen(key) : lengths.exists(key)));
      for (const [, n] of (await lengths.exec()) ?? []) markers += Number(n);
    }
  }
  const before = (await sampleMemory(ctx.nodes)).masters;
  for (const { server, keys } of perServer) {
    for (let i = 0; i < keys.length; i += 1_000) {
      const pipeline = server.pipeline();
      for (const key of keys.slice(i, i + 1_000)) pipeline.del(key);
      await pipeline.exec();
    }
  }
  const after = (await sampleMemory(ctx.nodes)).masters;
  return { markers, bytes: before - after };
}

export async function runDrain(ctx: AnyBenchContext, plan: DrainPlan): Promise<DrainOutcome> {
  const { contender, workload } = plan;
  const queue = queueName(ctx, contender, plan.label);
  const prefix = prefixName(ctx, contender, plan.label);
  const expected = workload.publishes.length;
  const warmup = plan.warmup?.publishes.length ?? 0;
  const tally = isTally(contender);
  await resetSpace(ctx, queue, prefix);
  const fill = plan.prepare ? await plan.prepare(prefix) : null;
  if (fill !== null) await waitForRehash(ctx.nodes, ctx.redisPrivate);
  // After the flush (and the replicas applying it) and the fill, before anything of this run is in Redis (the preload goes to RabbitMQ only).
  // A fill is hundreds of MB of replication stream: the replicas may take longer than 5 s to apply it, and until they
  // have, the masters' output buffers shrink and their CPU sends it during the drain.
  if (ctx.redisPrivate) await settleReplicas(ctx.nodes, fill === null ? 5_000 : 120_000);
  const memoryBefore = ctx.redisPrivate ? await sampleMemory(ctx.nodes) : null;
  const errorsBefore = ctx.redisPrivate ? await sampleErrors(ctx.nodes) : null;
  // A stream contender's queue is a stream, declared as one by the publisher (the daemon finds it).
  await publishAll([...(plan.warmup?.publishes ?? []), ...workload.publishes], { url: ctx.amqpUrl, queue, stream: readsStream(contender) });
  // Let the broker finish writing the preload before the clock runs.
  await sleep(500);

  const failed = (problem: string): DrainOutcome => ({
    record: {
      contender,
      round: plan.round,
      messages: expected,
      seconds: Number.NaN,
      msgPerSec: Number.NaN,
      cpuSeconds: Number.NaN,
      peakRssBytes: Number.NaN,
      redisCommands: null,
      redisMemoryBytes: null,
      redisCpuSeconds: null,
      ...(plan.variant ? { variant: plan.variant } : {}),
      correct: false,
      problem,
    },
  });
  let running: RunningContender;
  const metricsPort = tally ? await freePort() : undefined;
  try {
    running = await startContender({
      contender,
      queue,
      prefix,
      ...contextRunFields(ctx),
      expected: warmup + expected,
      warmup,
      recordLatency: false,
      tallyEnv: { ...ctx.tallyEnv, ...plan.tallyEnv },
      ...(metricsPort !== undefined ? { metricsPort } : {}),
      ...(plan.nodeArgs ? { nodeArgs: plan.nodeArgs } : {}),
    });
  } catch (error) {
    // A contender that cannot start is a failed run, recorded (the bench exits 1), not a skipped one.
    await resetSpace(ctx, queue, prefix);
    return failed(`did not start: ${error instanceof Error ? error.message : String(error)}`);
  }
  const sample = async (): Promise<WindowSample> => {
    const [cpu, mainCpu, redisCpu, commands] = await Promise.all([
      cpuSeconds(running.pid),
      threadCpuSeconds(running.pid).catch(() => Number.NaN),
      ctx.redisPrivate ? sampleCpu(ctx.nodes) : Promise.resolve(null),
      sampleCommands(ctx.nodes),
    ]);
    return { cpu, mainCpu, redisCpu, commands: commands.calls, commandUsec: commands.usec };
  };
  // The INFO commandstats and the two INFO cpu each master received, counted once they have run.
  const ownCommands = 3 * ctx.nodes.masters.length;
  let start: WindowSample | null = warmup === 0 ? await sample() : null;
  let startedAt: number | null = warmup === 0 ? running.consumingAt : null;
  let endedAt: number | null = null;
  let metricsReads: number | undefined;
  let batchSize: number | null = null;
  let problem: string | undefined;
  const timeoutMs = Math.max(60_000, ((warmup + expected) / 500) * 1_000);
  const connection = await amqp.connect(ctx.amqpUrl, { clientProperties: { connection_name: 'tally-bench-watch' } });
  try {
    const channel = await connection.createChannel();
    if (tally) {
      const watched = await watchDaemon({
        metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`,
        channel,
        queue,
        stream: readsStream(contender),
        warmup,
        expected: warmup + expected,
        onWarm: async (at) => {
          startedAt = at;
          start = await sample();
        },
      });
      metricsReads = watched.scrapes;
      batchSize = partsPerBatch(warmup > 0 ? watched.warm : null, watched.done);
      endedAt = watched.doneAt;
      if (endedAt === null)
        problem = `drain stalled: the daemon reported ${JSON.stringify(watched.last)} of ${warmup + expected} deliveries; daemon said: ${running.stderr().slice(-600)}`;
    } else {
      const timeout = sleep(timeoutMs, null, { ref: false });
      const reached = async <T>(event: Promise<T>, what: string): Promise<T | null> => {
        const report = await Promise.race([event, running.done.then(() => null as T | null), timeout]).catch((error: Error) => {
          problem = error.message;
          return null;
        });
        if (report === null) problem ??= `no ${what} report within ${timeoutMs} ms`;
        return report;
      };
      if (warmup > 0) {
        const warm = await reached(running.warm, 'warm');
        if (warm !== null) {
          startedAt = warm.at;
          start = await sample();
        }
      }
      const report = problem === undefined ? await reached(running.done, 'done') : null;
      if (report !== null) endedAt = report.at;
      if (report !== null && report.acked !== warmup + expected) problem = `acked ${report.acked} of ${warmup + expected}`;
    }
  } finally {
    await connection.close().catch(() => {});
  }
  const end = running.alive() ? await sample() : null;
  const rss = running.alive() ? await peakRssBytes(running.pid) : Number.NaN;
  const layout = running.layoutLine();
  const exit = await running.stop();
  if (exit.code !== 0 && problem === undefined) problem = `exited with ${exit.code ?? exit.signal} on SIGTERM: ${running.stderr().slice(-300)}`;
  if (fill !== null && tally && layout?.created !== false && problem === undefined)
    problem = `the daemon did not find the filled prefix's layout: ${JSON.stringify(layout)}`;
  // Steady state: the contender has stopped (its connections, buffers and heartbeat are gone), what it wrote stays,
  // on a cluster's replicas too once they have applied their masters' stream.
  if (memoryBefore !== null) await settleReplicas(ctx.nodes);
  const memoryAfter = memoryBefore === null ? null : await sampleMemory(ctx.nodes);
  const errorsAfter = errorsBefore === null ? null : await sampleErrors(ctx.nodes);

  // A stream keeps its messages once read (the broker counts them all): only a queue must be empty.
  const after = readsStream(contender) ? { messageCount: 0 } : await queueState(ctx.amqpUrl, queue);
  if (after.messageCount !== 0 && problem === undefined) problem = `${after.messageCount} message(s) left unacked in the queue after the stop`;
  if (contender !== 'ceiling' && contender !== 'ceiling-stream') {
    // After the clock: the counts of the warm-up and the workload, exactly.
    const truth = plan.warmup ? mergeTruths(plan.warmup.truth, workload.truth) : workload.truth;
    const counts = await readCounts(ctx.redis, { prefix, virtualShards: ctx.virtualShards }, []);
    const check = compareWithTruth(counts, truth);
    if (!check.exact) problem = `${problem ? `${problem}; ` : ''}counts: ${describeTruthCheck(check, counts, truth)}`;
  }

  let memory: MarkerMemoryRecord | undefined;
  if (plan.measureMarkers && fill === null && contender !== 'ceiling' && contender !== 'ceiling-stream' && problem === undefined) {
    // Markers of every contender: Tally's marker hashes (mk:) and the per-message keys (m:) of naive and batched.
    const measured = await measureMarkerMemory(ctx, `${escapeGlob(prefix)}m*:*`);
    if (measured) {
      memory = {
        contender,
        round: plan.round,
        markers: measured.markers,
        // The warm-up's markers are measured too.
        messages: workload.good + (plan.warmup?.good ?? 0),
        bytesPerMarker: measured.bytes / measured.markers,
        bytesPerMessage: measured.bytes / (workload.good + (plan.warmup?.good ?? 0)),
      };
    }
  }
  await resetSpace(ctx, queue, prefix);

  const windowStart = start as WindowSample | null;
  const seconds = endedAt === null || startedAt === null ? Number.NaN : (endedAt - startedAt) / 1000;
  const commandsBefore = windowStart?.commands ?? new Map<string, number>();
  const commandsAfter = end?.commands ?? new Map<string, number>();
  const redisCpuBefore = windowStart?.redisCpu ?? null;
  const redisCpuAfter = end?.redisCpu ?? null;
  const redisCommands =
    contender === 'ceiling' || contender === 'ceiling-stream' || !ctx.redisPrivate || windowStart === null || end === null
      ? null
      : sumValues(callsDelta(commandsBefore, commandsAfter)) - ownCommands;
  const warmupFigures: WarmupFigures | null =
    warmup > 0 && startedAt !== null
      ? { deliveries: warmup, seconds: (startedAt - running.consumingAt) / 1000, msgPerSec: warmup / ((startedAt - running.consumingAt) / 1000) }
      : null;
  const record: DrainRecord = {
    contender,
    round: plan.round,
    messages: expected,
    seconds,
    msgPerSec: expected / seconds,
    cpuSeconds: windowStart !== null && end !== null ? end.cpu - windowStart.cpu : Number.NaN,
    mainThreadCpuSeconds: windowStart !== null && end !== null ? end.mainCpu - windowStart.mainCpu : Number.NaN,
    peakRssBytes: rss,
    redisCommands,
    redisMemoryBytes: memoryBefore === null || memoryAfter === null ? null : memoryAfter.masters - memoryBefore.masters,
    redisCpuSeconds: redisCpuBefore === null || redisCpuAfter === null ? null : redisCpuAfter.masters - redisCpuBefore.masters,
    memoryDeliveries: warmup + expected,
    ...(warmupFigures ? { warmup: warmupFigures } : {}),
    ...(plan.variant ? { variant: plan.variant } : {}),
    ...(fill !== null ? { steady: { ...fill, layoutFound: layout?.created === false } } : {}),
    ...(metricsReads !== undefined ? { metricsReads } : {}),
    ...(batchSize !== null ? { partsPerBatch: batchSize } : {}),
    ...(ctx.nodes.topology === 'cluster' && memoryBefore && memoryAfter && redisCpuBefore && redisCpuAfter
      ? {
          cluster: {
            perMasterMemoryBytes: perNodeDelta(memoryBefore.perMaster, memoryAfter.perMaster),
            replicationBacklogBytes: memoryAfter.replicationBacklog - memoryBefore.replicationBacklog,
            replicaMemoryBytes: (memoryAfter.replicas ?? Number.NaN) - (memoryBefore.replicas ?? Number.NaN),
            replicaCpuSeconds: (redisCpuAfter.replicas ?? Number.NaN) - (redisCpuBefore.replicas ?? Number.NaN),
          },
        }
      : {}),
    ...(memoryBefore && memoryAfter && errorsBefore && errorsAfter
      ? {
          redisDetail: {
            keys: memoryAfter.keys,
            hashtableBytes: memoryAfter.hashtableBytes - memoryBefore.hashtableBytes,
            slotToKeysBytes: memoryAfter.slotToKeysBytes - memoryBefore.slotToKeysBytes,
            commandCalls: Object.fromEntries(callsDelta(commandsBefore, commandsAfter)),
            // Only over a whole window: one end missing would leave totals since the server started.
            ...(windowStart && end ? { commandUsec: Object.fromEntries(callsDelta(windowStart.commandUsec, end.commandUsec)) } : {}),
            errors: Object.fromEntries(callsDelta(errorsBefore, errorsAfter)),
          },
        }
      : {}),
    correct: problem === undefined,
    ...(problem !== undefined ? { problem } : {}),
  };
  return memory ? { record, memory } : { record };
}
