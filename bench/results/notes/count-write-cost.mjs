// What a batch's count writes cost Redis, per message, by how they are sent: the two-step write_counts script against
// the same increments natively (`node bench/results/notes/count-write-cost.mjs` after `pnpm build`; figures and what
// they mean in count-write-cost.md). One private server; CPU is INFO cpu deltas: run it on a quiet machine.
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startPrivateRedis } from '@tally/testkit';
import { WRITE_COUNTS } from '../../../packages/worker/dist/src/two-step-batch.js';

const server = await startPrivateRedis();
const redis = new Redis(server.url);
const cpu = async () => {
  const t = await redis.info('cpu');
  return Number(t.match(/used_cpu_user:([\d.]+)/)[1]) + Number(t.match(/used_cpu_sys:([\d.]+)/)[1]);
};
const MESSAGES = 200_000, BATCH = 500, SKUS = 3_000, TTL = 2_592_000;
await redis.script('LOAD', WRITE_COUNTS.source);
// 1 to 8 changes a message, uniform SKUs: what a batch of 500 sums to, per SKU (about 1,600 keys).
function batchSums() {
  const sums = new Map();
  for (let m = 0; m < BATCH; m++) {
    const k = 1 + Math.floor(Math.random() * 8);
    for (let c = 0; c < k; c++) {
      const key = `c:{0}:sku-${Math.floor(Math.random() * SKUS)}`;
      sums.set(key, (sums.get(key) ?? 0) + 1 + Math.floor(Math.random() * 9));
    }
  }
  return sums;
}
// Every count key exists first, as at steady state.
{
  const p = redis.pipeline();
  for (let s = 0; s < SKUS; s++) p.set(`c:{0}:sku-${s}`, '1', 'EX', TTL);
  await p.exec();
}
async function measure(name, perBatch) {
  const batches = Array.from({ length: MESSAGES / BATCH }, batchSums);
  const before = await cpu();
  for (const sums of batches) await perBatch([...sums.keys()], [...sums.values()].map(String));
  const after = await cpu();
  const keys = batches.reduce((a, b) => a + b.size, 0) / batches.length;
  console.log(`${name}: ${(((after - before) / MESSAGES) * 1e6).toFixed(2)} µs of Redis CPU per message (${keys.toFixed(0)} keys a batch)`);
}
const receipt = () => `c:{0}:w:${randomBytes(8).toString('hex')}`;
for (let round = 1; round <= 2; round++) {
  console.log(`round ${round}`);
  await measure('write_counts script, sums, no TTL refresh (as on the usual path)', async (keys, deltas) => {
    const r = receipt();
    await redis.evalsha(WRITE_COUNTS.sha, keys.length + 1, r, ...keys, String(TTL), '600', 'sums', '0'.repeat(keys.length), ...deltas);
  });
  await measure('native: WATCH + GET receipt, then MULTI of INCRBY per key + SET receipt EX, EXEC', async (keys, deltas) => {
    const r = receipt();
    await redis.watch(r);
    await redis.get(r);
    const t = redis.multi();
    for (let i = 0; i < keys.length; i++) t.incrby(keys[i], deltas[i]);
    t.set(r, '1', 'EX', 600);
    await t.exec();
  });
  await measure('native: pipeline of INCRBY per key + SET receipt (no transaction: the lower bound)', async (keys, deltas) => {
    const p = redis.pipeline();
    for (let i = 0; i < keys.length; i++) p.incrby(keys[i], deltas[i]);
    p.set(receipt(), '1', 'EX', 600);
    await p.exec();
  });
  await measure("reference's counts: pipeline of INCRBY + EXPIRE per key", async (keys, deltas) => {
    const p = redis.pipeline();
    for (let i = 0; i < keys.length; i++) p.incrby(keys[i], deltas[i]).expire(keys[i], TTL);
    await p.exec();
  });
}
redis.disconnect();
await server.stop();
