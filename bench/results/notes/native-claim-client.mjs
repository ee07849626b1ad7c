// What two-step batches cost this client and Redis per message, claims by the pipeline against claims by the
// script, through the worker's own runTwoStepBatch on one private redis-server (`node
// bench/results/notes/native-claim-client.mjs` after `pnpm build`). Where native-claim-cost.mjs measures the claim
// alone, this runs the whole batch (claims, counts, occupation) and counts the commands Redis ran.
//
// BEFORE=N (8000000 by default) records N markers for the bucket before the bucket of now, so that the bucket of
// now opens with as many hashes as at that steady rate (512 at 8M); BEFORE=0 leaves it at the initial count.
// N=batches of 500 messages (200), split over ORDER's runs (native,script,native,script).
import { randomUUID } from 'node:crypto';
import { runTwoStepBatch } from '../../../packages/worker/dist/src/two-step-batch.js';
import { markerDigest, markerShardOf, markerMetaKey } from '@tally/shared';
import { Redis } from 'ioredis';
import { startPrivateRedis, testWorkerSettings } from '@tally/testkit';

const quiet = { warn() {}, error() {} };
const SHARDS = 4;
const SHARD = 1;
const BATCH = 500;
const WIDTH_S = 120;
const N = Number(process.env.N ?? 200);
const BEFORE = Number(process.env.BEFORE ?? 8_000_000);
const ORDER = (process.env.ORDER ?? 'native,script,native,script').split(',');

const server = await startPrivateRedis();
const client = new Redis(server.url);
const settings = testWorkerSettings({
  redisUrl: server.url,
  prefix: `nc.${randomUUID().slice(0, 8)}:`,
  markerScope: 'message',
  virtualShards: SHARDS,
  markerTtlS: 2 * WIDTH_S,
  markerBucketS: WIDTH_S,
});

let next = 0;
/** A batch of whole messages of marker shard SHARD, three changes each. */
function batch() {
  const ids = [];
  while (ids.length < BATCH) {
    const id = `m-${next++}`;
    if (markerShardOf(markerDigest(id), SHARDS) === SHARD) ids.push(id);
  }
  const changes = ids.map((_, i) => [
    [`S${i % 300}`, 1],
    [`S${(i * 7) % 300}`, 2],
    [`T${i % 50}`, -1],
  ]);
  return { vshard: SHARD, batchId: randomUUID(), ids, changes };
}
const serverBucket = async () => Math.floor(Number((await client.time())[0]) / WIDTH_S);
const redisCpuS = async () => {
  const info = await client.info('cpu');
  return Number(/used_cpu_user:([\d.]+)/.exec(info)[1]) + Number(/used_cpu_sys:([\d.]+)/.exec(info)[1]);
};
const calls = async () =>
  Object.fromEntries(
    (await client.info('commandstats'))
      .split('\n')
      .filter((line) => line.startsWith('cmdstat_'))
      .map((line) => [line.slice(8, line.indexOf(':')), Number(/calls=(\d+)/.exec(line)[1])]),
  );

// The pipeline is trusted only well inside a bucket: start 10 to 90 s into one.
for (;;) {
  const phase = Number((await client.time())[0]) % WIDTH_S;
  if (phase >= 10 && phase < 90) break;
  await new Promise((resolve) => setTimeout(resolve, 1000));
}
if (BEFORE > 0) {
  // The bucket before, as a filtered bucket with an empty filter that received BEFORE markers.
  const meta = markerMetaKey(settings.prefix, SHARD, (await serverBucket()) - 1);
  await client.hset(meta, 'n', BEFORE, 's', 1, 'f', 64);
  await client.set(meta.replace(/:m$/, ':f'), Buffer.alloc(64 * 4));
}
// The first batch, by the script, opens the bucket of now; the thread learns its shape.
await runTwoStepBatch(client, settings, batch(), quiet);
await new Promise((resolve) => setTimeout(resolve, 300));
const [subs] = await client.hmget(markerMetaKey(settings.prefix, SHARD, await serverBucket()), 's');
console.log(`bucket of now: ${subs} hashes`);
const tasks = Array.from({ length: N }, batch);
const per = Math.floor(N / ORDER.length);
for (const [run, how] of ORDER.entries()) {
  const runSettings = { ...settings, nativeClaims: how === 'native' };
  const slice = tasks.slice(run * per, (run + 1) * per);
  const [callsBefore, cpuBefore] = [await calls(), await redisCpuS()];
  const clientBefore = process.cpuUsage();
  let native = 0;
  for (const task of slice) native += (await runTwoStepBatch(client, runSettings, task, quiet)).nativeClaims ?? 0;
  const spent = process.cpuUsage(clientBefore);
  const [callsAfter, cpuAfter] = [await calls(), await redisCpuS()];
  const messages = slice.length * BATCH;
  const perMessage = (name) => (((callsAfter[name] ?? 0) - (callsBefore[name] ?? 0)) / messages).toFixed(3);
  console.log(
    `${how.padEnd(6)}: client ${((spent.user + spent.system) / messages).toFixed(1)} µs/msg, Redis ${(((cpuAfter - cpuBefore) * 1e6) / messages).toFixed(2)} µs/msg; ` +
      `per message EXPIREAT ${perMessage('expireat')}, HSETNX ${perMessage('hsetnx')}; claimed by the pipeline ${native} of ${messages}`,
  );
}
client.disconnect();
await server.stop();
