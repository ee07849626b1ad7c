/**
 * `pnpm bench --natural-check`: does the steady-state fill stand in for a
 * natural steady state? On one private Redis, Tally two-step consumes a
 * load published at a fixed rate:
 *
 * 1. natural: from an empty prefix for two marker TTLs (every live bucket
 *    then holds what the daemon itself wrote, and older ones have expired),
 *    then a measured window;
 * 2. filled: on a prefix the bench's fill gave the population of that rate
 *    and TTL (steady-state.ts), after a short warm-up, a window as long.
 *
 * Both windows are measured the same way (natural-check.ts) and written to
 * natural-check.md/.json. The load is generated a minute at a time, so a
 * run of the default 600 s TTL never holds millions of messages in memory.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { Redis } from 'ioredis';
import { parseInfo } from '@tally/shared';
import { freePort, startPrivateRedis } from '@tally/testkit';
import { ensureQueue, generateWorkload } from '@tally/workload';
import { benchContext, contextRunFields, prefixName, queueName, type BenchContext } from './context.js';
import { startContender, type RunningContender } from './contenders.js';
import { metricValue } from './daemon-metrics.js';
import { resetSpace } from './drain.js';
import { renderNaturalCheck, windowFigures, type NaturalCheckRecord, type RunCounters, type WindowFigures } from './natural-check.js';
import { workloadShape, type BenchOptions } from './options.js';
import { cpuSeconds } from './proc.js';
import { commandTimes } from './redis-info.js';
import { BENCH_SERVER_ARGS, sampleCpu, waitForLazyFree, waitForRehash } from './redis-nodes.js';
import { steadyCountShares, steadyPrepare, steadyShares } from './steady-state.js';

/** Seconds of load generated (and published) per chunk. */
const CHUNK_S = 60;
/** Seconds of load after the fill before its window opens: connections, JIT, the first settled-filter copies. */
const FILLED_WARMUP_S = 20;

async function readCounters(ctx: BenchContext, daemon: RunningContender, metricsUrl: string): Promise<RunCounters> {
  const [text, daemonCpuS, cpu, commandstats, stats] = await Promise.all([
    fetch(metricsUrl).then((response) => response.text()),
    cpuSeconds(daemon.pid),
    sampleCpu(ctx.nodes),
    ctx.redis.info('commandstats'),
    ctx.redis.info('stats'),
  ]);
  const statsInfo = parseInfo(stats);
  return {
    atMs: performance.now(),
    messages: metricValue(text, 'tally_received_total') ?? Number.NaN,
    batches: metricValue(text, 'tally_batch_size_count') ?? Number.NaN,
    batchParts: metricValue(text, 'tally_batch_size_sum') ?? Number.NaN,
    daemonCpuS,
    redisCpuS: cpu.masters,
    commands: commandTimes(parseInfo(commandstats)),
    expiredKeys: Number(statsInfo.get('expired_keys') ?? Number.NaN),
    expireCycleMs: Number(statsInfo.get('expire_cycle_cpu_milliseconds') ?? Number.NaN),
  };
}

/** Markers the prefix holds (the meta hashes' `n`, summed) and its write receipts: one SCAN, outside the window. */
async function held(redis: Redis, prefix: string): Promise<{ markers: number; receipts: number }> {
  let markers = 0;
  let receipts = 0;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 5000);
    cursor = next;
    for (const key of keys) {
      if (key.startsWith(`${prefix}w:`)) receipts++;
      else if (key.startsWith(`${prefix}mk:`) && key.endsWith(':m')) markers += Number((await redis.hget(key, 'n')) ?? 0);
    }
  } while (cursor !== '0');
  return { markers, receipts };
}

interface LoadPlan {
  readonly rate: number;
  /** Seconds of load before the window, then the window's. */
  readonly beforeS: number;
  readonly windowS: number;
}

/**
 * Publishes `rate` messages a second to the daemon's queue until the window
 * has passed, sampling the counters when it opens and when it closes.
 * A backlog at the close (more than two seconds of load unacked) is a
 * problem: the window then measured a drain, not the rate.
 */
async function runLoad(
  ctx: BenchContext,
  options: BenchOptions,
  run: { queue: string; prefix: string; label: string; seed: number },
  plan: LoadPlan,
  atWindow: () => Promise<void> = async () => {},
): Promise<{ figures: WindowFigures | null; problems: string[] }> {
  const problems: string[] = [];
  const metricsPort = await freePort();
  const connection = await amqp.connect(ctx.amqpUrl, { clientProperties: { connection_name: `tally-bench-${run.label}` } });
  await ensureQueue(connection, run.queue);
  const totalS = plan.beforeS + plan.windowS;
  const daemon = await startContender({
    contender: 'tally-two-step',
    queue: run.queue,
    prefix: run.prefix,
    ...contextRunFields(ctx),
    expected: Math.ceil(plan.rate * totalS),
    recordLatency: false,
    tallyEnv: ctx.tallyEnv,
    metricsPort,
  });
  const metricsUrl = `http://127.0.0.1:${metricsPort}/metrics`;
  let start: RunCounters | null = null;
  let end: RunCounters | null = null;
  try {
    const channel = await connection.createConfirmChannel();
    const started = performance.now();
    let sent = 0;
    let chunk = 0;
    while (end === null) {
      const workload = generateWorkload({
        ...workloadShape(options),
        messages: plan.rate * CHUNK_S,
        seed: run.seed + chunk,
        idPrefix: `${run.label}${chunk}-`,
      });
      chunk += 1;
      for (const publish of workload.publishes) {
        for (;;) {
          const elapsedS = (performance.now() - started) / 1000;
          if (start === null && elapsedS >= plan.beforeS) {
            await atWindow();
            start = await readCounters(ctx, daemon, metricsUrl);
          }
          if (start !== null && elapsedS >= totalS) {
            end = await readCounters(ctx, daemon, metricsUrl);
            break;
          }
          if (sent < elapsedS * plan.rate) break;
          await sleep(2);
        }
        if (end !== null) break;
        sent += 1;
        if (!channel.sendToQueue(run.queue, publish.body, { persistent: true, contentType: 'application/json' }))
          await new Promise((resolve) => channel.once('drain', resolve));
      }
      if (!daemon.alive()) {
        problems.push(`the daemon exited during the ${run.label} run: ${daemon.stderr().slice(-600)}`);
        break;
      }
    }
    await channel.waitForConfirms();
    const backlog = (await channel.checkQueue(run.queue)).messageCount;
    if (backlog > plan.rate * 2)
      problems.push(`${run.label}: ${backlog} messages were still queued when the window closed: the daemon did not keep up with ${plan.rate} msg/s`);
  } finally {
    const exit = await daemon.stop();
    if (exit.code !== 0) problems.push(`${run.label}: the daemon exited with ${exit.code ?? exit.signal}`);
    await connection.close().catch(() => {});
  }
  return { figures: start !== null && end !== null ? windowFigures(start, end) : null, problems };
}

export async function runNaturalCheck(options: BenchOptions, outDir: string, log: (line: string) => void): Promise<number> {
  const rate = options.naturalRate;
  const ttl = options.naturalTtlS;
  const windowS = options.naturalWindowS;
  const server = options.redisUrl === null ? await startPrivateRedis({ args: BENCH_SERVER_ARGS }) : null;
  if (server === null) {
    log('natural check: it needs the private Redis (its CPU and command times are the figures); drop --redis-url');
    return 2;
  }
  const redis = new Redis(server.url, { connectionName: 'tally-bench-natural-check' });
  try {
    const ctx = benchContext(
      { ...options, tallyEnv: { ...options.tallyEnv, TALLY_MARKER_TTL_S: String(ttl) } },
      { redisUrl: server.url, redisPrivate: true, redis, runId: `nat${Date.now().toString(36)}`, traceSinkUrl: 'http://127.0.0.1:4318', log },
    );
    const problems: string[] = [];

    const naturalQueue = queueName(ctx, 'tally-two-step', 'natural');
    const naturalPrefix = prefixName(ctx, 'tally-two-step', 'natural');
    await resetSpace(ctx, naturalQueue, naturalPrefix);
    log(`natural run: ${rate} msg/s for ${2 * ttl} s (two marker TTLs of ${ttl} s), then a ${windowS} s window`);
    let naturalHeld = { markers: 0, receipts: 0 };
    const natural = await runLoad(
      ctx,
      options,
      { queue: naturalQueue, prefix: naturalPrefix, label: 'natural', seed: options.seed },
      { rate, beforeS: 2 * ttl, windowS },
      async () => {
        naturalHeld = await held(redis, naturalPrefix);
      },
    );
    problems.push(...natural.problems);
    await resetSpace(ctx, naturalQueue, naturalPrefix);

    const filledQueue = queueName(ctx, 'tally-two-step', 'filled');
    const filledPrefix = prefixName(ctx, 'tally-two-step', 'filled');
    await resetSpace(ctx, filledQueue, filledPrefix);
    const sample = generateWorkload({ ...workloadShape(options), messages: 20_000, seed: options.seed, idPrefix: 'shares-' });
    const fill = await steadyPrepare(ctx, {
      mode: 'two-step',
      rate,
      shares: steadyShares(ctx, 'two-step', sample),
      countShares: steadyCountShares(ctx, sample),
      seed: options.seed,
      drainBudgetS: FILLED_WARMUP_S + windowS,
    })(filledPrefix);
    // As before a steady drain: the fill's frees and the keyspace's rehash are not the window's.
    await waitForLazyFree(ctx.nodes);
    await waitForRehash(ctx.nodes, true);
    log(
      `filled run: ${fill.markers.toLocaleString('en')} markers filled in ${fill.fillSeconds.toFixed(1)} s; ${rate} msg/s for ${FILLED_WARMUP_S} s, then a ${windowS} s window`,
    );
    let filledHeld = { markers: 0, receipts: 0 };
    const filled = await runLoad(
      ctx,
      options,
      { queue: filledQueue, prefix: filledPrefix, label: 'filled', seed: options.seed + 1000 },
      { rate, beforeS: FILLED_WARMUP_S, windowS },
      async () => {
        filledHeld = await held(redis, filledPrefix);
      },
    );
    problems.push(...filled.problems);
    await resetSpace(ctx, filledQueue, filledPrefix);

    if (natural.figures === null || filled.figures === null) {
      for (const problem of problems) log(`problem: ${problem}`);
      log('natural check: FAILED: a run did not reach its window');
      return 1;
    }
    const record: NaturalCheckRecord = {
      rate,
      markerTtlS: ttl,
      windowS,
      natural: naturalHeld,
      filled: filledHeld,
      naturalWindow: natural.figures,
      filledWindow: filled.figures,
      problems,
    };
    const table = renderNaturalCheck(record);
    await mkdir(outDir, { recursive: true });
    await writeFile(join(outDir, 'natural-check.md'), `${table}\n`);
    await writeFile(join(outDir, 'natural-check.json'), `${JSON.stringify(record, null, 2)}\n`);
    process.stdout.write(`\n${table}\n\n`);
    log(`wrote ${join(outDir, 'natural-check.md')} and .json`);
    return problems.length === 0 ? 0 : 1;
  } finally {
    redis.disconnect();
    await server.stop();
  }
}
