// Does the size of a bucket's marker hashes move a claim's Redis cost? (`node
// bench/results/marker-hash-size/marker-hash-size.mjs` after `pnpm build`.) One private redis-server; each
// contender's bucket of now holds FILL markers (a busy shard's steady state) with its filter, in SUBS hashes: 64
// of ~16k markers (hashtables: what filtered buckets are opened with) or 16,384 of ~61 (listpacks). Claims by the
// pipeline and by the claim script; Redis CPU from INFO cpu, memory per marker from used_memory around the fill.
// It misses the hashes' creation (the buckets are prefilled): see README.md for the whole steady state.
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startPrivateRedis } from '@tally/testkit';
import { loadScript, evalshaArgs, runScript } from '../../../packages/worker/dist/src/lua-scripts.js';

const server = await startPrivateRedis();
const redis = new Redis(server.url);
const info = async (section, field) => Number(new RegExp(`${field}:([\\d.]+)`).exec(await redis.info(section))[1]);
const cpu = async () => (await info('cpu', 'used_cpu_user')) + (await info('cpu', 'used_cpu_sys'));
const N = Number(process.env.N ?? 200_000), BATCH = 500, WIDTH = 3600, TTL = 7200, BITS = 12, FILL = Number(process.env.FILL ?? 1_000_000);
const CLAIM = loadScript('claim_markers');
const log = { warn: () => {} };
const bucket = Math.floor(Date.now() / 1000 / WIDTH);

/** Fills `base`'s bucket of now with FILL markers in `subs` hashes, its filter and meta; the bytes it took per marker. */
async function prefill(base, subs) {
  const before = await info('memory', 'used_memory');
  const blocks = Math.ceil((FILL * 2 * BITS) / 32);
  const words = new Uint32Array(blocks);
  const per = Math.ceil(FILL / subs);
  let p = redis.pipeline();
  for (let h = 0; h < subs; h++) {
    const args = [];
    for (let i = 0; i < per; i++) {
      const d = randomBytes(16);
      const sub = h + subs * Math.floor(Math.random() * Math.floor(65536 / subs));
      d[0] = sub >> 8; d[1] = sub & 255;
      const block = d.readUInt32BE(4) % blocks;
      words[block] |= (1 << (d[8] % 32)) | (1 << (d[9] % 32)) | (1 << (d[10] % 32)) | (1 << (d[11] % 32));
      args.push(d, '1');
    }
    p.hset(`${base}:${bucket}:${h}`, ...args);
    p.expireat(`${base}:${bucket}:${h}`, (bucket + 1) * WIDTH + TTL);
    if (h % 256 === 255) { await p.exec(); p = redis.pipeline(); }
  }
  await p.exec();
  const filter = Buffer.alloc(blocks * 4);
  for (let b = 0; b < blocks; b++) filter.writeUInt32BE(words[b] >>> 0, b * 4);
  await redis.set(`${base}:${bucket}:f`, filter);
  await redis.hset(`${base}:${bucket}:m`, 's', subs, 'f', blocks, 'n', FILL);
  return { blocks, bytesPerMarker: ((await info('memory', 'used_memory')) - before) / FILL };
}

async function measure(name, perBatch) {
  const digests = Array.from({ length: N }, () => randomBytes(16));
  const before = await cpu();
  const client = process.cpuUsage();
  for (let i = 0; i < N; i += BATCH) await perBatch(digests.slice(i, i + BATCH), i / BATCH);
  const redisUs = (((await cpu()) - before) / N) * 1e6;
  const spent = process.cpuUsage(client);
  const clientUs = (spent.user + spent.system) / N;
  console.log(`${name}: ${redisUs.toFixed(2)} µs of Redis CPU per digest, ${clientUs.toFixed(2)} µs of this client's`);
  return { redis: +redisUs.toFixed(2), client: +clientUs.toFixed(2) };
}

const script = (base) => async (batch) => {
  await runScript(redis, CLAIM, evalshaArgs(CLAIM, [base], [WIDTH, TTL, 64, BITS, 'ab12', 30000, '', '', '', ...batch]), log);
};
/** The pipeline; EXPIREAT once per hash for the whole run (the thread's memory of the hashes it set). */
const native = (base, subs, blocks) => {
  const expiring = new Set();
  return async (batch, n) => {
    const id = `n${n.toString(36)}`;
    const p = redis.pipeline();
    p.time();
    p.hset(`${base}:${bucket}:m`, `b${id}`, `cab12:${Date.now()}`);
    const args = [];
    for (const d of batch) {
      const block = d.readUInt32BE(4) % blocks;
      for (const b of [d[8], d[9], d[10], d[11]]) args.push('SET', 'u1', block * 32 + 31 - (b % 32), 1);
    }
    p.call('BITFIELD', `${base}:${bucket}:f`, ...args);
    const fresh = new Set();
    for (const d of batch) {
      const key = `${base}:${bucket}:${((d[0] << 8) | d[1]) % subs}`;
      if (!expiring.has(key)) fresh.add(key);
      p.hsetnx(key, d, id);
    }
    for (const key of fresh) { p.expireat(key, (bucket + 1) * WIDTH + TTL); expiring.add(key); }
    p.hincrby(`${base}:${bucket}:m`, 'n', batch.length);
    p.time();
    await p.exec();
  };
};

const results = {};
for (let round = 1; round <= Number(process.env.ROUNDS ?? 2); round++) {
  for (const subs of [64, 16384]) {
    const n = await prefill(`n${subs}r${round}`, subs);
    const s = await prefill(`s${subs}r${round}`, subs);
    console.log(`${subs} hashes: ${n.bytesPerMarker.toFixed(1)} / ${s.bytesPerMarker.toFixed(1)} bytes per marker (filter included)`);
    results[`native ${subs} r${round}`] = { ...(await measure(`pipeline, ${subs} hashes`, native(`n${subs}r${round}`, subs, n.blocks))), bytes: +n.bytesPerMarker.toFixed(1) };
    results[`script ${subs} r${round}`] = { ...(await measure(`claim script, ${subs} hashes`, script(`s${subs}r${round}`))), bytes: +s.bytesPerMarker.toFixed(1) };
  }
}
console.log(JSON.stringify(results, null, 1));
redis.disconnect();
await server.stop();
