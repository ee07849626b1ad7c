// What the marker operations cost Redis natively, per digest, on one private server (`node bench/results/notes/marker-floor.mjs`
// after `pnpm build`; figures and what they mean in marker-floor.md). CPU is INFO cpu deltas: run it on a quiet machine.
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startPrivateRedis } from '@tally/testkit';
const server = await startPrivateRedis();
const redis = new Redis(server.url);
const cpu = async () => { const t = await redis.info('cpu'); return Number(t.match(/used_cpu_user:([\d.]+)/)[1]) + Number(t.match(/used_cpu_sys:([\d.]+)/)[1]); };
const N = 400_000, BATCH = 500, HASHES = 32;
// A bucket-like population first: 32 hashes of 10,000 fields (hashtables, as in a filtered bucket), so lookups meet real ones.
for (let h = 0; h < HASHES; h++) { const a = []; for (let i = 0; i < 10_000; i++) a.push(randomBytes(16), '1'); await redis.hset(`pop:${h}`, ...a); }
const digests = Array.from({ length: N }, () => randomBytes(16));
async function measure(name, perBatch) {
  const before = await cpu();
  for (let i = 0; i < N; i += BATCH) await perBatch(digests.slice(i, i + BATCH), i);
  const after = await cpu();
  console.log(`${name}: ${(((after - before) / N) * 1e6).toFixed(2)} µs of Redis CPU per digest`);
}
const hashOf = (d) => `pop:${((d[0] << 8) | d[1]) % HASHES}`;
await measure('HSET, one command per hash per batch (native)', async (batch) => {
  const by = new Map(); for (const d of batch) { const k = hashOf(d); if (!by.has(k)) by.set(k, []); by.get(k).push(d, '7'); }
  const p = redis.pipeline(); for (const [k, a] of by) p.hset(k, ...a); await p.exec();
});
for (let i = 0; i < N; i++) digests[i] = randomBytes(16);
await measure('HSETNX, one command per digest, pipelined (native)', async (batch) => {
  const p = redis.pipeline(); for (const d of batch) p.hsetnx(hashOf(d), d, '7'); await p.exec();
});
await measure('HMGET, one command per hash per batch (native)', async (batch) => {
  const by = new Map(); for (const d of batch) { const k = hashOf(d); if (!by.has(k)) by.set(k, []); by.get(k).push(d); }
  const p = redis.pipeline(); for (const [k, a] of by) p.hmget(k, ...a); await p.exec();
});
await redis.call('BITFIELD', 'filt', 'SET', 'u32', '#300000', '0');
await measure('BITFIELD GET u32, one command per batch (native)', async (batch) => {
  const a = []; for (const d of batch) a.push('GET', 'u32', `#${d.readUInt32BE(4) % 300000}`); await redis.call('BITFIELD', 'filt', ...a);
});
// The hand-written reference: MGET of the batch's keys, then SET EX per new one.
for (let i = 0; i < N; i++) digests[i] = randomBytes(16);
await measure('reference: MGET per batch + SET … EX per digest (native)', async (batch) => {
  const keys = batch.map((d) => `m:${d.toString('hex')}`);
  await redis.mget(...keys);
  const p = redis.pipeline(); for (const k of keys) p.set(k, '1', 'EX', 600); await p.exec();
});
redis.disconnect(); await server.stop();
