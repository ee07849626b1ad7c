/**
 * `pnpm bench --scale-out`: Tally (atomic mode) on a standalone Redis against Tally on a
 * Redis Cluster of 3 masters (3 replicas), the same workload, pair by pair,
 * with 1, 2 and 3 daemons on one queue. Both servers are the bench's own
 * (a private redis-server and testkit's cluster), started once.
 *
 *   for each round, for each daemon count: standalone, then cluster (order rotated by round)
 *     reset -> preload -> start N daemons at once -> [clock from the first one consuming]
 *           -> every count at its truth and nothing ready -> [clock stops] -> SIGTERM all -> verify exact
 *
 * Then, with --redis-figures (always in the full run), the Redis figures on
 * both servers: memory and CPU per message, masters summed and replicas
 * apart (redis-figures-run.ts).
 *
 * Every run must count exactly (exit 1 otherwise); the speeds never decide
 * the exit code. On a 2-core machine several daemons and six Redis servers
 * share the same two cores as RabbitMQ: the figures show the overheads, not
 * what more machines would give.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { Cluster, Redis } from 'ioredis';
import { countKey, shardOf } from '@tally/shared';
import { readCounts } from '@tally/coordinator/counts';
import { resetNamespace, startPrivateRedis, startRedisCluster, type PrivateRedis, type RedisCluster } from '@tally/testkit';
import { compareWithTruth, describeTruthCheck, generateWorkload, publishAll, type Workload } from '@tally/workload';
import { startContender, type RunningContender } from './contenders.js';
import { queueState } from './broker.js';
import { benchContext } from './context.js';
import { keyGroups } from './key-groups.js';
import { workloadShape, type BenchOptions } from './options.js';
import {
  renderBreakdownTable,
  renderClusterRatioTable,
  renderFiguresTable,
  renderIdleLine,
  summarizeFigures,
  type FiguresRow,
  type IdleCpu,
  type TopologyDrain,
} from './redis-figures.js';
import { runRedisFigures } from './redis-figures-run.js';
import { BENCH_SERVER_ARGS, clusterNodes, disconnectNodes, type RedisNodes } from './redis-nodes.js';
import { renderCommandTimeTable } from './render-table.js';
import { roundOrder } from './run-bench.js';
import { median } from './stats.js';

const VIRTUAL_SHARDS = 16;

/** The daemons' virtual shard count: 16 unless --tally-env sets TALLY_VIRTUAL_SHARDS (coarser parts on a cluster, say), so counts are read where they were written. */
function virtualShardsOf(options: Pick<BenchOptions, 'tallyEnv'>): number {
  return Number(options.tallyEnv.TALLY_VIRTUAL_SHARDS ?? VIRTUAL_SHARDS);
}

export interface ScaleOutRecord {
  readonly topology: 'standalone' | 'cluster';
  readonly daemons: number;
  readonly round: number;
  readonly messages: number;
  readonly seconds: number;
  readonly msgPerSec: number;
  readonly correct: boolean;
  readonly problem?: string;
}

interface Topology {
  readonly name: 'standalone' | 'cluster';
  readonly url: string;
  readonly client: Redis | Cluster;
}

/** Reads the counts of `keys` grouped by virtual shard: one MGET per shard, which is one slot on a cluster. */
async function readByShard(client: Redis | Cluster, keys: ReadonlyArray<{ key: string; vshard: number }>): Promise<Map<string, string | null>> {
  const values = new Map<string, string | null>();
  await Promise.all(
    keyGroups(keys, true).map(async (group) => {
      const replies = await client.mget(group.map((g) => g.key));
      group.forEach(({ key }, i) => values.set(key, replies[i] ?? null));
    }),
  );
  return values;
}

/** Epoch ms when every count reached its truth and nothing was ready; null after 20 s without progress. */
async function watchDrain(
  topology: Topology,
  channel: amqp.Channel,
  queue: string,
  prefix: string,
  truth: ReadonlyMap<string, number>,
  virtualShards: number,
): Promise<number | null> {
  let pending = [...truth].map(([sku, want]) => {
    const vshard = shardOf(sku, virtualShards);
    return { key: countKey(prefix, vshard, sku), vshard, want };
  });
  let lastProgress = Date.now();
  for (;;) {
    const values = await readByShard(topology.client, pending);
    const still = pending.filter((p) => Number(values.get(p.key) ?? 0) !== p.want);
    if (still.length < pending.length) lastProgress = Date.now();
    pending = still;
    if (pending.length === 0 && (await channel.checkQueue(queue)).messageCount === 0) return Date.now();
    if (Date.now() - lastProgress > 20_000) return null;
    await sleep(50);
  }
}

async function runOne(options: BenchOptions, topology: Topology, daemons: number, round: number, workload: Workload, runId: string): Promise<ScaleOutRecord> {
  const label = `${topology.name}.d${daemons}.r${round}`;
  const queue = `bench.scale.${runId}.${label}`;
  const prefix = `bench:${runId}:scale:${label}:`;
  const messages = workload.publishes.length;
  const base = { topology: topology.name, daemons, round, messages };
  await resetNamespace({ amqpUrl: options.amqpUrl, redisUrl: topology.url, queue, prefix });
  await publishAll(workload.publishes, { url: options.amqpUrl, queue });
  await sleep(500);
  const running: RunningContender[] = [];
  let problem: string | undefined;
  let seconds = Number.NaN;
  try {
    const started = await Promise.all(
      Array.from({ length: daemons }, () =>
        startContender({
          // Atomic: exact with several daemons on one queue (two-step can count a duplicate twice
          // when two daemons take its copies at the same instant; docs/scale-out.md), so every run is checked exactly.
          contender: 'tally-atomic',
          queue,
          prefix,
          amqpUrl: options.amqpUrl,
          redisUrl: topology.url,
          prefetch: options.prefetch,
          ackEvery: options.ackEvery,
          ackWaitMs: options.ackWaitMs,
          expected: messages,
          recordLatency: false,
          tallyEnv: { TALLY_VIRTUAL_SHARDS: String(virtualShardsOf(options)), ...options.tallyEnv },
        }),
      ),
    );
    running.push(...started);
    const connection = await amqp.connect(options.amqpUrl, { clientProperties: { connection_name: 'tally-bench-watch' } });
    try {
      const channel = await connection.createChannel();
      const endedAt = await watchDrain(topology, channel, queue, prefix, workload.truth, virtualShardsOf(options));
      const startedAt = Math.min(...running.map((r) => r.consumingAt));
      if (endedAt === null) problem = 'drain stalled';
      else seconds = (endedAt - startedAt) / 1000;
    } finally {
      await connection.close().catch(() => {});
    }
  } catch (error) {
    problem = `did not run: ${error instanceof Error ? error.message : String(error)}`;
  } finally {
    const exits = await Promise.all(running.map((r) => r.stop()));
    if (problem === undefined && exits.some((e) => e.code !== 0))
      problem = `a daemon exited with ${exits.map((e) => e.code ?? e.signal).join(', ')} on SIGTERM`;
  }
  if ((await queueState(options.amqpUrl, queue)).messageCount !== 0) problem ??= 'messages left in the queue';
  const counts = await readCounts(topology.client, { prefix, virtualShards: virtualShardsOf(options) }, []);
  const check = compareWithTruth(counts, workload.truth);
  if (!check.exact) problem = `${problem ? `${problem}; ` : ''}counts: ${describeTruthCheck(check, counts, workload.truth)}`;
  await resetNamespace({ amqpUrl: options.amqpUrl, redisUrl: topology.url, queue, prefix });
  return { ...base, seconds, msgPerSec: messages / seconds, correct: problem === undefined, ...(problem ? { problem } : {}) };
}

export function scaleOutTable(records: readonly ScaleOutRecord[]): string {
  const counts = [...new Set(records.map((r) => r.daemons))].sort((a, b) => a - b);
  const rate = (topology: ScaleOutRecord['topology'], daemons: number): number =>
    median(records.filter((r) => r.topology === topology && r.daemons === daemons && r.correct).map((r) => r.msgPerSec));
  const lines = ['| daemons | standalone msg/s | cluster (3 masters) msg/s | cluster / standalone | all runs exact |', '|---:|---:|---:|---:|---|'];
  for (const d of counts) {
    const [s, c] = [rate('standalone', d), rate('cluster', d)];
    const exact = records.filter((r) => r.daemons === d).every((r) => r.correct);
    lines.push(`| ${d} | ${Math.round(s)} | ${Math.round(c)} | ${(c / s).toFixed(2)} | ${exact ? 'yes' : 'NO'} |`);
  }
  return lines.join('\n');
}

export async function runScaleOut(options: BenchOptions, outDir: string, log: (line: string) => void): Promise<number> {
  const daemonCounts = options.quick ? [1, 2] : [1, 2, 3];
  const runId = `${Date.now().toString(36)}${process.pid.toString(36)}`;
  let standalone: PrivateRedis | null = null;
  let cluster: RedisCluster | null = null;
  const clients: Array<Redis | Cluster> = [];
  let clusterInfoNodes: RedisNodes | null = null;
  const records: ScaleOutRecord[] = [];
  let figures: { drains: TopologyDrain[]; idle: IdleCpu[]; rows: FiguresRow[] } | null = null;
  // The machine is shared: the load average through the run says how much the figures can be trusted.
  const loads: number[] = [loadavg()[0]!];
  const loadTimer = setInterval(() => loads.push(loadavg()[0]!), 10_000).unref();
  try {
    standalone = await startPrivateRedis({ args: BENCH_SERVER_ARGS });
    // Redis's default node timeout, not the tests' 1 s: a steady-state fill's scripts and a large flush keep a
    // master busy for over a second on two shared cores, and a failover mid-run (a replica promoted without the
    // fill's script, a client left on the demoted node) is not what the figures measure.
    cluster = await startRedisCluster({ replicasPerMaster: options.clusterReplicas, nodeTimeoutMs: 15_000, args: BENCH_SERVER_ARGS });
    log(
      `private redis-server on ${standalone.url}; cluster of 3 masters + ${3 * options.clusterReplicas} replicas on ${cluster.seedUrls.slice(0, 3).join(', ')} ...`,
    );
    const standaloneClient = new Redis(standalone.url, { connectionName: 'tally-bench' });
    const clusterClient = new Cluster([...cluster.seeds], { redisOptions: { connectionName: 'tally-bench' } });
    clients.push(standaloneClient, clusterClient);
    const topologies: Topology[] = [
      { name: 'standalone', url: standalone.url, client: standaloneClient },
      { name: 'cluster', url: cluster.seedUrls.join(','), client: clusterClient },
    ];
    const workload = generateWorkload({ ...workloadShape(options), badRate: 0, idPrefix: 'scale' });
    log(`workload: ${workload.publishes.length} deliveries, ${workload.truth.size} SKUs; daemons ${daemonCounts.join(', ')}; ${options.rounds} round(s)`);
    for (let round = 0; round < options.rounds; round++) {
      for (const daemons of daemonCounts) {
        // Pair by pair: the same daemon count on both topologies back to back, the order rotated each round.
        for (const topology of roundOrder(topologies, round + daemons)) {
          const record = await runOne(options, topology, daemons, round, workload, runId);
          records.push(record);
          log(
            `  round ${round + 1} ${topology.name.padEnd(10)} ${daemons} daemon(s): ${Number.isFinite(record.msgPerSec) ? `${Math.round(record.msgPerSec)} msg/s` : 'no rate'} ` +
              `${record.seconds.toFixed(2)} s  ${record.correct ? 'exact' : `PROBLEM: ${record.problem}`}`,
          );
        }
      }
    }
    if (options.redisFigures) {
      log(
        `Redis figures: ceiling, batched, two-step, atomic, stream on each topology${options.steadyState ? `, batched and the Tally modes again at the steady state of ${options.steadyRate} msg/s` : ''}; ` +
          `${options.rounds} round(s); cluster = its 3 masters summed, replicas apart`,
      );
      clusterInfoNodes = clusterNodes(
        (await cluster.masters()).map((n) => n.url),
        (await cluster.replicas()).map((n) => n.url),
      );
      const shared = { redisPrivate: true, runId: `${runId}f`, traceSinkUrl: 'http://127.0.0.1:4318', log };
      log(`Redis figures: ${options.warmupMessages} warm-up messages drained by every contender before its measured window`);
      const measured = await runRedisFigures(
        [
          { name: 'standalone', ctx: benchContext(options, { ...shared, redisUrl: standalone.url, redis: standaloneClient }) },
          {
            name: 'cluster',
            ctx: benchContext<Cluster>(options, { ...shared, redisUrl: cluster.seedUrls.join(','), redis: clusterClient, nodes: clusterInfoNodes }),
          },
        ],
        workload,
        options.rounds,
        log,
        options.steadyState ? { rate: options.steadyRate, seed: options.seed, phase: options.steadyPhase } : null,
        options.warmupMessages > 0
          ? generateWorkload({ ...workloadShape(options), messages: options.warmupMessages, badRate: 0, seed: options.seed + 7_919, idPrefix: 'warm' })
          : undefined,
      );
      figures = { ...measured, rows: summarizeFigures(measured.drains, measured.idle, options.rounds) };
    }
  } finally {
    clearInterval(loadTimer);
    if (clusterInfoNodes) disconnectNodes(clusterInfoNodes);
    for (const client of clients) client.disconnect();
    await cluster?.stop();
    await standalone?.stop();
  }
  loads.push(loadavg()[0]!);
  const loadLine = `Load average (1 min) during the run: ${Math.min(...loads).toFixed(1)} to ${Math.max(...loads).toFixed(1)}, median ${median(loads).toFixed(1)} (${loads.length} samples).`;
  const table = scaleOutTable(records);
  const figuresText = figures
    ? [
        '',
        `## Redis figures (${options.rounds} round(s), medians; cluster: 3 masters summed, ${options.clusterReplicas} replica(s) each reported apart)`,
        renderFiguresTable(figures.rows),
        renderIdleLine(figures.idle),
        '### Cluster ÷ standalone, Redis CPU per message (masters summed)',
        renderClusterRatioTable(figures.rows),
        '### Where the bytes go, and redirects to another node',
        renderBreakdownTable(figures.rows),
        '### Redis time by command (masters summed)',
        renderCommandTimeTable(
          { drains: figures.drains.map((d) => d.record) },
          8,
          (record) => figures!.drains.find((d) => d.record === record)?.topology ?? '',
        ),
      ].join('\n\n')
    : '';
  const heading =
    `# Tally scale-out (${options.quick ? 'quick' : 'full'} run), finished ${new Date().toISOString()}\n\n` +
    `Workload: ${options.messages} messages + ${Number((options.duplicateRate * 100).toFixed(2))}% duplicates, ${options.skus} SKUs, ${options.minChanges}-${options.maxChanges} changes; ` +
    `${options.rounds} round(s); cluster: 3 masters, ${options.clusterReplicas} replica(s) each.\n\n`;
  const report = `${heading}${table}${figuresText}\n\n${loadLine}\n`;
  process.stdout.write(`\n${report}\n`);
  await mkdir(outDir, { recursive: true });
  await writeFile(
    join(outDir, 'scale-out.json'),
    `${JSON.stringify(
      {
        finishedAt: new Date().toISOString(),
        quick: options.quick,
        messages: options.messages,
        clusterReplicasPerMaster: options.clusterReplicas,
        workload: {
          messages: options.messages,
          skus: options.skus,
          changes: `${options.minChanges}-${options.maxChanges}`,
          duplicateRate: options.duplicateRate,
        },
        loadAverage1m: loads,
        records,
        ...(figures ? { redisFigures: figures } : {}),
      },
      null,
      2,
    )}\n`,
  );
  await writeFile(join(outDir, 'scale-out.md'), report);
  log(`wrote ${join(outDir, 'scale-out.json')}, ${join(outDir, 'scale-out.md')}`);
  const failed = records.some((r) => !r.correct) || (figures?.rows.some((r) => !r.correct) ?? false);
  for (const d of figures?.drains ?? [])
    if (!d.record.correct) log(`problem: ${d.topology} ${d.record.contender} round ${d.record.round + 1}: ${d.record.problem}`);
  log(failed ? 'bench --scale-out: FAILED: a run miscounted or did not run' : 'bench --scale-out: every run counted exactly');
  return failed ? 1 : 0;
}
