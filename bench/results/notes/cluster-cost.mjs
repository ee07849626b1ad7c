// Two-step (or MODE=atomic), as the daemon lays markers out for each topology: Redis CPU per message on a standalone Redis and on a 3-master cluster (no
// replicas; REPLICAS=1 gives each master one, masters still summed alone), the batches run one at a time from this process with the worker's own code (no broker, no daemon),
// rounds alternating between the two. `node bench/results/notes/cluster-cost.mjs` after `pnpm build`.
// Batches of BATCH messages per marker shard, zipf SKUs over 3,000, 1-8 changes, 3 % redeliveries. Prints, per
// topology, the median Redis CPU per message (masters summed, idle CPU subtracted) and the commands by calls and wall time per message.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { createRedisClient } from '../../../packages/runtime/dist/src/index.js';
import { FILTER_BITS, markerDigest, markerShardOf, shardOf } from '@tally/shared';
import { startPrivateRedis, startRedisCluster, testWorkerSettings } from '@tally/testkit';
import { runAtomicBatch } from '../../../packages/worker/dist/src/atomic-batch.js';
import { runTwoStepBatch } from '../../../packages/worker/dist/src/two-step-batch.js';
import { seededDraws } from './seeded-draws.mjs';

const BATCH = Number(process.env.BATCH ?? 300), BLOCK = Number(process.env.BLOCK ?? 20), ROUNDS = Number(process.env.ROUNDS ?? 8);
const SHARDS = 16;
// MODE=atomic: atomic mode, message scope on the standalone Redis and on the cluster message scope with fenced
// adoption (its batches run as two-step's, worker/src/fenced-adoption.ts), as the daemon lays a new prefix out; PART=1
// gives the cluster part scope instead (each message split into one part per virtual shard, a lane per shard), as
// prefixes laid out before fenced adoption have it.
const MODE = process.env.MODE ?? 'two-step';
const PART = process.env.PART === '1';
const fencedOnCluster = MODE === 'atomic' && !PART;
const runBatchOn = (topology) => (MODE === 'atomic' && !(topology === 'cluster' && fencedOnCluster) ? runAtomicBatch : runTwoStepBatch);
const quiet = { warn() {}, error() {} };

const standalone = await startPrivateRedis();
const cluster = await startRedisCluster({ replicasPerMaster: Number(process.env.REPLICAS ?? 0) });
const masters = (await cluster.masters()).map((node) => new Redis(node.port));
const single = [new Redis(standalone.url)];
const clients = {
  standalone: createRedisClient(standalone.url, 'exp', {}, 'standalone'),
  cluster: createRedisClient(cluster.seedUrls.join(','), 'exp', {}, 'cluster'),
};
const servers = { standalone: single, cluster: masters };
const settingsOf = (topology) =>
  testWorkerSettings({
    redisUrl: topology === 'cluster' ? cluster.seedUrls.join(',') : standalone.url,
    prefix: `exp:${topology}:`,
    mode: MODE,
    markerScope: MODE === 'atomic' && topology === 'cluster' && PART ? 'part' : 'message',
    fencedAdoption: topology === 'cluster' && fencedOnCluster,
    // A new prefix's filters in either scope (digest16-filtered-buckets-v1 for part scope), as the daemon records them.
    markerFilterBits: FILTER_BITS,
    virtualShards: SHARDS,
    redisTopology: topology,
  });
const settings = { standalone: settingsOf('standalone'), cluster: settingsOf('cluster') };

const { random, sku } = seededDraws(7);
const recent = [];
let counter = 0;
function message() {
  if (recent.length > 2000 && random() < 0.03) return recent[Math.floor(random() * recent.length)];
  const id = `m-${counter++}-${randomUUID()}`;
  const changes = Array.from({ length: 1 + Math.floor(random() * 8) }, () => [sku(), Math.floor(random() * 20) - 10 || 1]);
  const m = { id, digest: markerDigest(id), changes };
  recent.push(m);
  if (recent.length > 20000) recent.shift();
  return m;
}
/**
 * The same messages as batches for each scope: `message`, dealt to their marker shards, a batch once a shard holds
 * BATCH messages; `part`, each message split by virtual shard, a batch once a shard holds BATCH parts. Both until
 * BLOCK × BATCH messages are dealt, and what is left in a lane is flushed: every message in both.
 */
function tasks() {
  const messages = Array.from({ length: BLOCK * BATCH }, message);
  const deal = (entries) => {
    const out = [], lanes = new Map();
    const flush = (shard, lane) => lane.length > 0 && out.push({ vshard: shard, batchId: randomUUID(), digests: lane.map((x) => x.digest), changes: lane.map((x) => x.changes) });
    for (const [shard, entry] of entries) {
      const lane = lanes.get(shard) ?? [];
      lanes.set(shard, lane);
      lane.push(entry);
      if (lane.length === BATCH) flush(shard, lane.splice(0));
    }
    for (const [shard, lane] of lanes) flush(shard, lane);
    return out;
  };
  const byMessage = deal(messages.map((m) => [markerShardOf(m.digest, SHARDS), m]));
  const byPart = deal(
    messages.flatMap((m) => {
      const parts = new Map();
      for (const change of m.changes) parts.set(shardOf(change[0], SHARDS), [...(parts.get(shardOf(change[0], SHARDS)) ?? []), change]);
      return [...parts].map(([shard, changes]) => [shard, { digest: m.digest, changes }]);
    }),
  );
  return { message: byMessage, part: byPart };
}
const infoOf = async (nodes) => {
  let cpu = 0;
  const calls = new Map(), usec = new Map();
  for (const node of nodes) {
    const text = await node.info('all');
    cpu += Number(/used_cpu_user:([\d.]+)/.exec(text)[1]) + Number(/used_cpu_sys:([\d.]+)/.exec(text)[1]);
    for (const [, command, c, u] of text.matchAll(/cmdstat_(\w+):calls=(\d+),usec=(\d+)/g)) {
      calls.set(command, (calls.get(command) ?? 0) + Number(c));
      usec.set(command, (usec.get(command) ?? 0) + Number(u));
    }
  }
  return { cpu, calls, usec };
};
// Idle CPU per second of each topology (cron, and on a cluster its bus): subtracted from each round by its length.
const idle = {};
for (const topology of ['standalone', 'cluster']) {
  const before = await infoOf(servers[topology]);
  await new Promise((resolve) => setTimeout(resolve, 3000));
  idle[topology] = ((await infoOf(servers[topology])).cpu - before.cpu) / 3;
}
const run = async (topology, block) => {
  const before = await infoOf(servers[topology]);
  const startedAt = performance.now();
  for (const task of block[settings[topology].markerScope]) await runBatchOn(topology)(clients[topology], settings[topology], task, quiet);
  const seconds = (performance.now() - startedAt) / 1000;
  const after = await infoOf(servers[topology]);
  const messages = BLOCK * BATCH;
  const byCommand = {};
  for (const [command, c] of after.calls) {
    if (command === 'info') continue;
    const dc = c - (before.calls.get(command) ?? 0), du = after.usec.get(command) - (before.usec.get(command) ?? 0);
    if (dc > 0) byCommand[command] = [dc / messages, du / messages];
  }
  return { cpu: ((after.cpu - before.cpu - idle[topology] * seconds) * 1e6) / messages, byCommand };
};

for (let i = 0; i < 6; i++) {
  const block = tasks();
  for (const topology of ['standalone', 'cluster']) await run(topology, block);
}
const results = { standalone: [], cluster: [] };
for (let round = 0; round < ROUNDS; round++) {
  const block = tasks();
  for (const topology of round % 2 ? ['cluster', 'standalone'] : ['standalone', 'cluster']) results[topology].push(await run(topology, block));
}
const median = (values) => values.slice().sort((a, b) => a - b)[values.length >> 1];
for (const topology of ['standalone', 'cluster']) {
  const cpus = results[topology].map((r) => r.cpu);
  const last = results[topology].at(-1).byCommand;
  const commands = Object.entries(last)
    .sort(([, a], [, b]) => b[1] - a[1])
    .map(([command, [c, u]]) => `${command} ${c.toFixed(3)}/${u.toFixed(2)}µs`)
    .join(', ');
  console.log(`${topology}: Redis CPU µs/msg by round ${cpus.map((v) => v.toFixed(2)).join(' ')}; median ${median(cpus).toFixed(2)}\n  last round, per message (calls/wall µs): ${commands}`);
}
console.log(`idle CPU, ms/s: standalone ${(idle.standalone * 1000).toFixed(1)}, cluster ${(idle.cluster * 1000).toFixed(1)} (subtracted above)`);
console.log(`cluster ÷ standalone: ${(median(results.cluster.map((r) => r.cpu)) / median(results.standalone.map((r) => r.cpu))).toFixed(2)}`);
for (const client of [...Object.values(clients), ...masters, ...single]) client.disconnect();
await cluster.stop();
await standalone.stop();
