/**
 * One throughput measurement: preload a queue with a workload, drain it
 * with one contender, measure, then check that it counted correctly.
 *
 *   reset -> publish (confirms) -> start contender -> [clock starts when it consumes]
 *         -> done (its own report, or counts == truth and queue empty for Tally)
 *         -> [clock stops; CPU, peak RSS, Redis commands read] -> SIGTERM -> verify
 */
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { escapeGlob } from '@tally/shared';
import { readCounts } from '@tally/coordinator/counts';
import { parseInfo } from '@tally/shared';
import { resetNamespace } from '@tally/testkit';
import { compareWithTruth, describeTruthCheck, publishAll, type Workload } from '@tally/workload';
import type { BenchContext } from './context.js';
import { contextRunFields, prefixName, queueName } from './context.js';
import { isTally, startContender, type RunningContender } from './contenders.js';
import { cpuSeconds, peakRssBytes } from './proc.js';
import { callsDelta, commandCalls, sumValues } from './redis-info.js';
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

async function commandSnapshot(ctx: BenchContext): Promise<Map<string, number>> {
  return commandCalls(parseInfo(await ctx.redis.info('commandstats')));
}

async function usedMemory(ctx: BenchContext): Promise<number> {
  return Number(parseInfo(await ctx.redis.info('memory')).get('used_memory'));
}

/** CPU seconds (user + system, main thread and children) the Redis server has used so far (INFO cpu). */
async function redisCpuSeconds(ctx: BenchContext): Promise<number> {
  const info = parseInfo(await ctx.redis.info('cpu'));
  return Number(info.get('used_cpu_sys')) + Number(info.get('used_cpu_user'));
}

/** Clean slate for a run: the bench's own queue, and its prefix (or the whole private Redis). */
export async function resetSpace(ctx: BenchContext, queue: string, prefix: string): Promise<void> {
  await resetNamespace({ amqpUrl: ctx.amqpUrl, redisUrl: ctx.redisUrl, queue, prefix });
  if (ctx.redisPrivate) await ctx.redis.flushall();
}

/** Keys matching a pattern (SCAN, never KEYS). */
async function scanKeys(redis: BenchContext['redis'], pattern: string): Promise<string[]> {
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
 * used_memory drops. Measured on the private Redis only, where nothing else
 * allocates meanwhile; the keys' expiry entries are included, as they should be.
 */
export async function measureMarkerMemory(ctx: BenchContext, pattern: string): Promise<{ markers: number; bytes: number } | null> {
  if (!ctx.redisPrivate) return null;
  const keys = await scanKeys(ctx.redis, pattern);
  if (keys.length === 0) return null;
  // A marker hash holds many markers (its fields); a marker key is one.
  let markers = 0;
  for (let i = 0; i < keys.length; i += 1_000) {
    const pipeline = ctx.redis.pipeline();
    for (const key of keys.slice(i, i + 1_000)) pipeline.type(key);
    const types = (await pipeline.exec()) ?? [];
    const lengths = ctx.redis.pipeline();
    keys.slice(i, i + 1_000).forEach((key, j) => (types[j]?.[1] === 'hash' ? lengths.hlen(key) : lengths.exists(key)));
    for (const [, n] of (await lengths.exec()) ?? []) markers += Number(n);
  }
  const before = await usedMemory(ctx);
  for (let i = 0; i < keys.length; i += 1_000) await ctx.redis.del(...keys.slice(i, i + 1_000));
  const after = await usedMemory(ctx);
  return { markers, bytes: before - after };
}

export async function runDrain(ctx: BenchContext, plan: DrainPlan): Promise<DrainOutcome> {
  const { contender, workload } = plan;
  const queue = queueName(ctx, contender, plan.label);
  const prefix = prefixName(ctx, contender, plan.label);
  const expected = workload.publishes.length;
  await resetSpace(ctx, queue, prefix);
  // After the flush, before anything of this run is in Redis (the preload goes to RabbitMQ only).
  const memoryBefore = ctx.redisPrivate ? await usedMemory(ctx) : null;
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
  const commandsBefore = await commandSnapshot(ctx);
  const redisCpuBefore = ctx.redisPrivate ? await redisCpuSeconds(ctx) : null;
  let ownCommands = 3; // the INFO commandstats and the two INFO cpu, counted once they have run
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
  const redisCpuAfter = ctx.redisPrivate ? await redisCpuSeconds(ctx) : null;
  const commandsAfter = await commandSnapshot(ctx);
  const exit = await running.stop();
  if (exit.code !== 0 && problem === undefined) problem = `exited with ${exit.code ?? exit.signal} on SIGTERM: ${running.stderr().slice(-300)}`;
  // Steady state: the contender has stopped (its connections, buffers and heartbeat are gone), what it wrote stays.
  const memoryAfter = memoryBefore === null ? null : await usedMemory(ctx);

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
    redisMemoryBytes: memoryBefore === null || memoryAfter === null ? null : memoryAfter - memoryBefore,
    redisCpuSeconds: redisCpuBefore === null || redisCpuAfter === null ? null : redisCpuAfter - redisCpuBefore,
    correct: problem === undefined,
    ...(problem !== undefined ? { problem } : {}),
  };
  return memory ? { record, memory } : { record };
}
