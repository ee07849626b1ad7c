/**
 * `pnpm bench --partitions`: one preloaded workload drained by Tally (atomic)
 * with TALLY_PARTITIONS = 1, 2, 4 and 1 to 3 daemons, on the bench's own
 * redis-server and the local RabbitMQ.
 *
 *   for each round, for each N, for each D:
 *     reset -> declare N queues (as the daemon does) -> preload -> start D daemons at once
 *           -> [clock from the first one consuming] -> every count at its truth, every queue empty
 *           -> [clock stops] -> SIGTERM all -> daemon CPU seconds per message -> verify exact
 *
 * On a 2-core machine RabbitMQ, Redis and every daemon share the same two
 * cores: the figures show what partitions cost and where the box saturates,
 * not what more machines give. The per-message costs (daemon CPU, the run's
 * wall clock) are what the capacity table in docs/scale-out.md is derived from.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { Redis } from 'ioredis';
import { CONSISTENT_HASH_EXCHANGE, countKey, PARTITION_WEIGHT, partitionQueues, shardOf } from '@tally/shared';
import { readCounts } from '@tally/coordinator/counts';
import { resetNamespace, startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import { compareWithTruth, describeTruthCheck, generateWorkload, publishAll, type Workload } from '@tally/workload';
import { startContender, type RunningContender } from './contenders.js';
import { workloadShape, type BenchOptions } from './options.js';
import { cpuSeconds } from './proc.js';
import { median } from './stats.js';

const VIRTUAL_SHARDS = 16;

export interface PartitionRecord {
  readonly partitions: number;
  readonly daemons: number;
  readonly round: number;
  readonly messages: number;
  readonly seconds: number;
  readonly msgPerSec: number;
  /** Daemon CPU (main thread and workers, every daemon summed) per message, µs. */
  readonly daemonCpuUsPerMsg: number;
  readonly correct: boolean;
  readonly problem?: string;
}

/** The queues a partitioned daemon declares (classic), so the preload lands before any daemon runs. */
async function declare(url: string, queue: string, partitions: number): Promise<void> {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createChannel();
    await channel.assertQueue(`${queue}.dead`, { durable: true });
    if (partitions === 1) {
      await channel.assertQueue(queue, { durable: true });
      return;
    }
    await channel.assertExchange(queue, CONSISTENT_HASH_EXCHANGE, { durable: true });
    for (const name of partitionQueues(queue, partitions)) {
      await channel.assertQueue(name, { durable: true, arguments: { 'x-single-active-consumer': true } });
      await channel.bindQueue(name, queue, PARTITION_WEIGHT);
    }
  } finally {
    await connection.close().catch(() => {});
  }
}

async function readyIn(url: string, queue: string, partitions: number): Promise<number> {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createChannel();
    let ready = 0;
    for (const name of partitionQueues(queue, partitions)) ready += (await channel.checkQueue(name)).messageCount;
    return ready;
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Epoch ms when every count reached its truth and no queue holds a ready message; null after 20 s without progress. */
async function watchDrain(
  redis: Redis,
  url: string,
  queue: string,
  partitions: number,
  prefix: string,
  truth: ReadonlyMap<string, number>,
): Promise<number | null> {
  let pending = [...truth].map(([sku, want]) => ({ key: countKey(prefix, shardOf(sku, VIRTUAL_SHARDS), sku), want }));
  let lastProgress = Date.now();
  for (;;) {
    const values = pending.length === 0 ? [] : await redis.mget(pending.map((p) => p.key));
    const still = pending.filter((p, i) => Number(values[i] ?? 0) !== p.want);
    if (still.length < pending.length) lastProgress = Date.now();
    pending = still;
    if (pending.length === 0 && (await readyIn(url, queue, partitions)) === 0) return Date.now();
    if (Date.now() - lastProgress > 20_000) return null;
    await sleep(50);
  }
}

async function runOne(
  options: BenchOptions,
  redis: PrivateRedis,
  client: Redis,
  partitions: number,
  daemons: number,
  round: number,
  workload: Workload,
  runId: string,
): Promise<PartitionRecord> {
  const label = `n${partitions}.d${daemons}.r${round}`;
  const queue = `bench.part.${runId}.${label}`;
  const prefix = `bench:${runId}:part:${label}:`;
  const messages = workload.publishes.length;
  const base = { partitions, daemons, round, messages };
  const space = { amqpUrl: options.amqpUrl, redisUrl: redis.url, queue, prefix, partitions };
  await resetNamespace(space);
  await declare(options.amqpUrl, queue, partitions);
  await publishAll(workload.publishes, { url: options.amqpUrl, queue, partitions });
  await sleep(500);
  const running: RunningContender[] = [];
  let problem: string | undefined;
  let seconds = Number.NaN;
  let cpu = Number.NaN;
  try {
    running.push(
      ...(await Promise.all(
        Array.from({ length: daemons }, () =>
          startContender({
            contender: 'tally-atomic',
            queue,
            prefix,
            amqpUrl: options.amqpUrl,
            redisUrl: redis.url,
            prefetch: options.prefetch,
            ackEvery: options.ackEvery,
            ackWaitMs: options.ackWaitMs,
            expected: messages,
            recordLatency: false,
            // Short beats: daemons started together settle their partition shares within a second.
            tallyEnv: { TALLY_VIRTUAL_SHARDS: String(VIRTUAL_SHARDS), TALLY_PARTITIONS: String(partitions), TALLY_HEARTBEAT_MS: '500', ...options.tallyEnv },
          }),
        ),
      )),
    );
    const cpuBefore = await Promise.all(running.map((r) => cpuSeconds(r.pid)));
    const endedAt = await watchDrain(client, options.amqpUrl, queue, partitions, prefix, workload.truth);
    const cpuAfter = await Promise.all(running.map((r) => cpuSeconds(r.pid)));
    cpu = cpuAfter.reduce((sum, after, i) => sum + after - cpuBefore[i]!, 0);
    const startedAt = Math.min(...running.map((r) => r.consumingAt));
    if (endedAt === null) problem = 'drain stalled';
    else seconds = (endedAt - startedAt) / 1000;
  } catch (error) {
    problem = `did not run: ${error instanceof Error ? error.message : String(error)}`;
  } finally {
    const exits = await Promise.all(running.map((r) => r.stop()));
    if (problem === undefined && exits.some((e) => e.code !== 0))
      problem = `a daemon exited with ${exits.map((e) => e.code ?? e.signal).join(', ')} on SIGTERM`;
  }
  const counts = await readCounts(client, { prefix, virtualShards: VIRTUAL_SHARDS }, []);
  const check = compareWithTruth(counts, workload.truth);
  if (!check.exact) problem = `${problem ? `${problem}; ` : ''}counts: ${describeTruthCheck(check, counts, workload.truth)}`;
  await resetNamespace(space);
  return {
    ...base,
    seconds,
    msgPerSec: messages / seconds,
    daemonCpuUsPerMsg: (cpu * 1e6) / messages,
    correct: problem === undefined,
    ...(problem ? { problem } : {}),
  };
}

export function partitionsTable(records: readonly PartitionRecord[]): string {
  const ns = [...new Set(records.map((r) => r.partitions))].sort((a, b) => a - b);
  const ds = [...new Set(records.map((r) => r.daemons))].sort((a, b) => a - b);
  const lines = ['| partitions | daemons | msg/s (median) | daemon CPU µs/msg | all runs exact |', '|---:|---:|---:|---:|---|'];
  for (const n of ns) {
    for (const d of ds) {
      const runs = records.filter((r) => r.partitions === n && r.daemons === d);
      if (runs.length === 0) continue;
      const ok = runs.filter((r) => r.correct);
      lines.push(
        `| ${n} | ${d} | ${Math.round(median(ok.map((r) => r.msgPerSec)))} | ${median(ok.map((r) => r.daemonCpuUsPerMsg)).toFixed(1)} | ${ok.length === runs.length ? 'yes' : 'NO'} |`,
      );
    }
  }
  return lines.join('\n');
}

export async function runPartitions(options: BenchOptions, outDir: string, log: (line: string) => void): Promise<number> {
  const partitionCounts = options.quick ? [1, 4] : [1, 2, 4];
  const daemonCounts = options.quick ? [1, 2] : [1, 2, 3];
  const runId = `${Date.now().toString(36)}${process.pid.toString(36)}`;
  const records: PartitionRecord[] = [];
  const loads: number[] = [loadavg()[0]!];
  const loadTimer = setInterval(() => loads.push(loadavg()[0]!), 10_000).unref();
  let redis: PrivateRedis | null = null;
  let client: Redis | null = null;
  try {
    redis = await startPrivateRedis();
    client = new Redis(redis.url, { connectionName: 'tally-bench' });
    const workload = generateWorkload({ ...workloadShape(options), badRate: 0, idPrefix: 'part' });
    log(
      `workload: ${workload.publishes.length} deliveries; partitions ${partitionCounts.join(', ')} x daemons ${daemonCounts.join(', ')}; ${options.rounds} round(s)`,
    );
    for (let round = 0; round < options.rounds; round++) {
      for (const partitions of partitionCounts) {
        for (const daemons of daemonCounts) {
          const record = await runOne(options, redis, client, partitions, daemons, round, workload, runId);
          records.push(record);
          log(
            `  round ${round + 1} N=${partitions} D=${daemons}: ${Number.isFinite(record.msgPerSec) ? `${Math.round(record.msgPerSec)} msg/s` : 'no rate'} ` +
              `${record.seconds.toFixed(2)} s, daemon CPU ${record.daemonCpuUsPerMsg.toFixed(1)} µs/msg  ${record.correct ? 'exact' : `PROBLEM: ${record.problem}`}`,
          );
        }
      }
    }
  } finally {
    clearInterval(loadTimer);
    client?.disconnect();
    await redis?.stop();
  }
  loads.push(loadavg()[0]!);
  const table = partitionsTable(records);
  const loadLine = `Load average (1 min) during the run: ${Math.min(...loads).toFixed(1)} to ${Math.max(...loads).toFixed(1)} (${loads.length} samples).`;
  await mkdir(outDir, { recursive: true });
  await writeFile(join(outDir, 'partitions.json'), JSON.stringify({ records, loads }, null, 2));
  await writeFile(join(outDir, 'partitions.md'), `# Partitioned queues: preloaded drain, Tally atomic\n\n${table}\n\n${loadLine}\n`);
  log(table);
  log(loadLine);
  return records.every((r) => r.correct) ? 0 : 1;
}
