/**
 * One throughput measurement: preload a queue with a workload, drain it
 * with one contender, measure, then check that it counted correctly.
 *
 *   reset -> publish (confirms) -> start contender -> [clock starts when it consumes]
 *         -> done (its own report, or counts == truth and queue empty for Tally)
 *         -> [clock stops; CPU, peak RSS, Redis commands read] -> SIGTERM -> verify
 *
 * The Redis figures are read from every server the context names: the one
 * standalone server, or a Redis Cluster's masters summed (its replicas apart).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { escapeGlob } from '@tally/shared';
import { readCounts } from '@tally/coordinator/counts';
import { resetNamespace } from '@tally/testkit';
import { compareWithTruth, describeTruthCheck, publishAll, type Workload } from '@tally/workload';
import type { AnyBenchContext } from './context.js';
import { contextRunFields, prefixName, queueName } from './context.js';
import { isTally, startContender, type RunningContender } from './contenders.js';
import { cpuSeconds, peakRssBytes } from './proc.js';
import { callsDelta, perNodeDelta, sumValues } from './redis-info.js';
import { flushMasters, sampleCommands, sampleCpu, sampleErrors, sampleMemory, settleReplicas, type RedisNodes } from './redis-nodes.js';
import type { ContenderName, DrainRecord, MarkerMemoryRecord } from './results.js';
import { watchCounts } from './tally-progress.js';
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
}

export interface DrainOutcome {
  readonly record: DrainRecord;
  readonly memory?: MarkerMemoryRecord;
}

/** Clean slate for a run: the bench's own queue, and its prefix (or the whole private Redis: every master of a private cluster). */
export async function resetSpace(ctx: AnyBenchContext, queue: string, prefix: string): Promise<void> {
  await resetNamespace({ amqpUrl: ctx.amqpUrl, redisUrl: ctx.redisUrl, queue, prefix });
  if (ctx.redisPrivate) await flushMasters(ctx.nodes);
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
  await resetSpace(ctx, queue, prefix);
  // After the flush (and the replicas applying it), before anything of this run is in Redis (the preload goes to RabbitMQ only).
  if (ctx.redisPrivate) await settleReplicas(ctx.nodes);
  const memoryBefore = ctx.redisPrivate ? await sampleMemory(ctx.nodes) : null;
  const errorsBefore = ctx.redisPrivate ? await sampleErrors(ctx.nodes) : null;
  await publishAll(workload.publishes, { url: ctx.amqpUrl, queue });
  // Let the broker finish writing the preload before the clock runs.
  await sleep(500);

  let running: RunningContender;
  try {
    running = await startContender({
      contender,
      queue,
      prefix,
      ...contextRunFields(ctx),
      expected,
      recordLatency: false,
      tallyEnv: { ...ctx.tallyEnv, ...plan.tallyEnv },
      ...(plan.nodeArgs ? { nodeArgs: plan.nodeArgs } : {}),
    });
  } catch (error) {
    // A contender that cannot start is a failed run, recorded (the bench exits 1), not a skipped one.
    await resetSpace(ctx, queue, prefix);
    const problem = `did not start: ${error instanceof Error ? error.message : String(error)}`;
    return {
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
        correct: false,
        problem,
      },
    };
  }
  const cpuStart = await cpuSeconds(running.pid);
  const commandsBefore = await sampleCommands(ctx.nodes);
  const redisCpuBefore = ctx.redisPrivate ? await sampleCpu(ctx.nodes) : null;
  // The INFO commandstats and the two INFO cpu each master received, counted once they have run.
  let ownCommands = 3 * ctx.nodes.masters.length;
  let endedAt: number | null = null;
  let problem: string | undefined;
  const timeoutMs = Math.max(60_000, (expected / 500) * 1_000);
  const connection = await amqp.connect(ctx.amqpUrl, { clientProperties: { connection_name: 'tally-bench-watch' } });
  try {
    const channel = await connection.createChannel();
    if (isTally(contender)) {
      const watched = await watchCounts(ctx, channel, queue, prefix, workload.truth);
      ownCommands += watched.ownCommands;
      endedAt = watched.at;
      if (endedAt === null) problem = `drain stalled with ${watched.pendingSkus} SKU(s) short of the truth; daemon said: ${running.stderr().slice(-600)}`;
    } else {
      const timeout = sleep(timeoutMs, null, { ref: false });
      const report = await Promise.race([running.done, timeout]).catch((error: Error) => {
        problem = error.message;
        return null;
      });
      if (report !== null) endedAt = report.at;
      else problem ??= `no done report within ${timeoutMs} ms`;
      if (report !== null && report.acked !== expected) problem = `acked ${report.acked} of ${expected}`;
    }
  } finally {
    await connection.close().catch(() => {});
  }
  const cpu = running.alive() ? (await cpuSeconds(running.pid)) - cpuStart : Number.NaN;
  const rss = running.alive() ? await peakRssBytes(running.pid) : Number.NaN;
  const redisCpuAfter = ctx.redisPrivate ? await sampleCpu(ctx.nodes) : null;
  const commandsAfter = await sampleCommands(ctx.nodes);
  const exit = await running.stop();
  if (exit.code !== 0 && problem === undefined) problem = `exited with ${exit.code ?? exit.signal} on SIGTERM: ${running.stderr().slice(-300)}`;
  // Steady state: the contender has stopped (its connections, buffers and heartbeat are gone), what it wrote stays,
  // on a cluster's replicas too once they have applied their masters' stream.
  if (memoryBefore !== null) await settleReplicas(ctx.nodes);
  const memoryAfter = memoryBefore === null ? null : await sampleMemory(ctx.nodes);
  const errorsAfter = errorsBefore === null ? null : await sampleErrors(ctx.nodes);

  const after = await queueState(ctx.amqpUrl, queue);
  if (after.messageCount !== 0 && problem === undefined) problem = `${after.messageCount} message(s) left unacked in the queue after the stop`;
  if (contender !== 'ceiling') {
    const counts = await readCounts(ctx.redis, { prefix, virtualShards: ctx.virtualShards }, []);
    const check = compareWithTruth(counts, workload.truth);
    if (!check.exact) problem = `${problem ? `${problem}; ` : ''}counts: ${describeTruthCheck(check, counts, workload.truth)}`;
  }

  let memory: MarkerMemoryRecord | undefined;
  if (plan.measureMarkers && contender !== 'ceiling' && problem === undefined) {
    // Markers of every contender: Tally's marker hashes (mk:) and the per-message keys (m:) of naive and batched.
    const measured = await measureMarkerMemory(ctx, `${escapeGlob(prefix)}m*:*`);
    if (measured) {
      memory = {
        contender,
        round: plan.round,
        markers: measured.markers,
        messages: workload.good,
        bytesPerMarker: measured.bytes / measured.markers,
        bytesPerMessage: measured.bytes / workload.good,
      };
    }
  }
  await resetSpace(ctx, queue, prefix);

  const seconds = endedAt === null ? Number.NaN : (endedAt - running.consumingAt) / 1000;
  const redisCommands = contender === 'ceiling' || !ctx.redisPrivate ? null : sumValues(callsDelta(commandsBefore, commandsAfter)) - ownCommands;
  const record: DrainRecord = {
    contender,
    round: plan.round,
    messages: expected,
    seconds,
    msgPerSec: expected / seconds,
    cpuSeconds: cpu,
    peakRssBytes: rss,
    redisCommands,
    redisMemoryBytes: memoryBefore === null || memoryAfter === null ? null : memoryAfter.masters - memoryBefore.masters,
    redisCpuSeconds: redisCpuBefore === null || redisCpuAfter === null ? null : redisCpuAfter.masters - redisCpuBefore.masters,
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
            errors: Object.fromEntries(callsDelta(errorsBefore, errorsAfter)),
          },
        }
      : {}),
    correct: problem === undefined,
    ...(problem !== undefined ? { problem } : {}),
  };
  return memory ? { record, memory } : { record };
}
