// What a claim costs Redis per digest: the claim script against the same claims made by native commands
// (`node bench/results/notes/native-claim-cost.mjs` after `pnpm build`). One private redis-server, CPU from INFO cpu;
// the client's CPU (this process, all of ioredis) beside it.
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { startPrivateRedis } from '@tally/testkit';
import { loadScript, evalshaArgs, runScript } from '../../../packages/worker/dist/src/lua-scripts.js';
const server = await startPrivateRedis();
const redis = new Redis(server.url);
const cpu = async () => { const t = await redis.info('cpu'); return Number(t.match(/used_cpu_user:([\d.]+)/)[1]) + Number(t.match(/used_cpu_sys:([\d.]+)/)[1]); };
const N = Number(process.env.N ?? 300_000), BATCH = 500, SUBS = 64, WIDTH = 3600, TTL = 7200, BITS = 12;
const CLAIM = loadScript('claim_markers');
const log = { warn: () => {} };
async function measure(name, perBatch) {
  const digests = Array.from({ length: N }, () => randomBytes(16));
  const before = await cpu();
  const client = process.cpuUsage();
  for (let i = 0; i < N; i += BATCH) await perBatch(digests.slice(i, i + BATCH), i / BATCH);
  const after = await cpu();
  const us = ((after - before) / N) * 1e6;
  const spent = process.cpuUsage(client);
  const clientUs = (spent.user + spent.system) / N;
  console.log(`${name}: ${us.toFixed(2)} µs of Redis CPU per digest, ${clientUs.toFixed(2)} µs of this client's`);
  return { redis: us, client: clientUs };
}
// STEADY=1: each contender's bucket of now already holds FILL markers in SUBS hashes (hashtables), with its filter, as at steady state.
const STEADY = process.env.STEADY === '1', FILL = 1_000_000;
async function prefill(base) {
  if (!STEADY) return;
  const bucket = Math.floor(Date.now() / 1000 / WIDTH);
  const blocks = Math.ceil((FILL * 2 * BITS) / 32);
  const words = new Uint32Array(blocks);
  for (let h = 0; h < SUBS; h++) {
    const args = [];
    for (let i = 0; i < FILL / SUBS; i++) {
      const d = randomBytes(16);
      d[0] = h >> 8; d[1] = h & 255;
      const block = d.readUInt32BE(4) % blocks;
      words[block] |= (1 << (d[8] % 32)) | (1 << (d[9] % 32)) | (1 << (d[10] % 32)) | (1 << (d[11] % 32));
      args.push(d, '1');
    }
    await redis.hset(`${base}:${bucket}:${h}`, ...args);
  }
  const filter = Buffer.alloc(blocks * 4);
  for (let b = 0; b < blocks; b++) filter.writeUInt32BE(words[b] >>> 0, b * 4);
  await redis.set(`${base}:${bucket}:f`, filter);
  await redis.hset(`${base}:${bucket}:m`, 's', SUBS, 'f', blocks, 'n', FILL);
}
// The contender's bucket of now, opened by the script as a daemon's first claim of a bucket would: its number and
// its filter's block count.
async function openBucket(base) {
  await runScript(redis, CLAIM, evalshaArgs(CLAIM, [base], [WIDTH, TTL, SUBS, BITS, 'ab12', 30000, '', '', '', randomBytes(16)]), log);
  const bucket = Math.floor(Date.now() / 1000 / WIDTH);
  return { bucket, blocks: Number(await redis.hget(`${base}:${bucket}:m`, 'f')) };
}
// Each contender on its own shard base, in a bucket it opens with the same sizes.
const script = (base) => async (batch) => {
  await runScript(redis, CLAIM, evalshaArgs(CLAIM, [base], [WIDTH, TTL, SUBS, BITS, 'ab12', 30000, '', '', '', ...batch]), log);
};
const native = (base, withFilter, bitsPerDigest = 4) => {
  let bucket, blocks;
  return async (batch, n) => {
    if (bucket === undefined) ({ bucket, blocks } = await openBucket(base));
    const id = `n${n.toString(36)}`;
    const p = redis.pipeline();
    p.time();
    p.hset(`${base}:${bucket}:m`, `b${id}`, `cab12:${Date.now()}`);
    if (withFilter) {
      const args = [];
      for (const d of batch) {
        const block = d.readUInt32BE(4) % blocks;
        for (const b of [d[8], d[9], d[10], d[11]].slice(0, bitsPerDigest)) args.push('SET', 'u1', block * 32 + 31 - (b % 32), 1);
      }
      p.call('BITFIELD', `${base}:${bucket}:f`, ...args);
    }
    const touched = new Set();
    for (const d of batch) {
      const key = `${base}:${bucket}:${((d[0] << 8) | d[1]) % SUBS}`;
      touched.add(key);
      p.hsetnx(key, d, id);
    }
    for (const key of touched) p.expireat(key, (bucket + 1) * WIDTH + TTL);
    p.hincrby(`${base}:${bucket}:m`, 'n', batch.length);
    p.time();
    await p.exec();
  };
};
// The same writes as the pipeline, from one lean script: HSETNX per digest, the filter bits (the worker sends each
// digest's block offset and mask, 8 bytes), EXPIREAT per hash created, in one EVALSHA.
const LEAN = `
local base, bucket, id, subs, expiresAt = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local packed = ARGV[5]
local prefix = base .. ':' .. bucket .. ':'
local out, words, order = {}, {}, {}
local keys = {}
for i = 6, #ARGV do
  local d = ARGV[i]
  local sub = (string.byte(d, 1) * 256 + string.byte(d, 2)) % subs
  local key = keys[sub]
  if key == nil then key = prefix .. sub; keys[sub] = key end
  out[i - 5] = redis.call('HSETNX', key, d, id)
end
local args = {}
for j = 1, #packed, 8 do
  local b1, b2, b3, b4, m1, m2, m3, m4 = string.byte(packed, j, j + 7)
  local block = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
  local mask = ((m1 * 256 + m2) * 256 + m3) * 256 + m4
  args[#args + 1] = 'GET'; args[#args + 1] = 'u32'; args[#args + 1] = '#' .. block
  order[#order + 1] = {block, mask}
end
local got = redis.call('BITFIELD', prefix .. 'f', unpack(args))
args = {}
for k, bm in ipairs(order) do
  local word = bit.bor(got[k], bm[2]) % 4294967296
  if word ~= got[k] then args[#args + 1] = 'SET'; args[#args + 1] = 'u32'; args[#args + 1] = '#' .. bm[1]; args[#args + 1] = string.format('%d', word) end
end
if #args > 0 then redis.call('BITFIELD', prefix .. 'f', unpack(args)) end
redis.call('HINCRBY', prefix .. 'm', 'n', #ARGV - 5)
return out
`;
const lean = (base) => {
  let bucket, blocks, sha;
  return async (batch, n) => {
    if (bucket === undefined) {
      ({ bucket, blocks } = await openBucket(base));
      sha = await redis.script('LOAD', LEAN);
    }
    const packed = Buffer.alloc(batch.length * 8);
    batch.forEach((d, j) => {
      packed.writeUInt32BE(d.readUInt32BE(4) % blocks, j * 8);
      packed.writeUInt32BE(((1 << (d[8] % 32)) | (1 << (d[9] % 32)) | (1 << (d[10] % 32)) | (1 << (d[11] % 32))) >>> 0, j * 8 + 4);
    });
    await redis.evalsha(sha, 1, base, bucket, `n${n.toString(36)}`, SUBS, (bucket + 1) * WIDTH + TTL, packed, ...batch);
  };
};
// Optimistic claims: WATCH the filter, read the digests' filter words, then one MULTI of the record, the words
// OR'd and one multi-field HSET per hash. A field is only written where a filter bit was clear, so it cannot be
// there (every claimer sets the bits with or before the field); the WATCH aborts the EXEC if anyone changed the
// filter in between. Not built: it needs a connection of its own (an EXEC resent without its WATCH after a
// reconnect would write unconditionally).
const watched = (base) => {
  let bucket, blocks;
  return async (batch, n) => {
    if (bucket === undefined) ({ bucket, blocks } = await openBucket(base));
    const f = `${base}:${bucket}:f`, meta = `${base}:${bucket}:m`;
    await redis.watch(f);
    const get = [];
    const slots = batch.map((d) => ({ block: d.readUInt32BE(4) % blocks, mask: ((1 << (d[8] % 32)) | (1 << (d[9] % 32)) | (1 << (d[10] % 32)) | (1 << (d[11] % 32))) >>> 0 }));
    const blockIndex = new Map();
    for (const { block } of slots) if (!blockIndex.has(block)) { blockIndex.set(block, blockIndex.size); get.push('GET', 'u32', `#${block}`); }
    const read = redis.pipeline();
    read.exists(f); read.hmget(meta, 's', 'f'); read.call('BITFIELD_RO', f, ...get);
    const [, , [, words]] = await read.exec();
    const next = Uint32Array.from(words);
    const bySub = new Map();
    const id = `n${n.toString(36)}`;
    slots.forEach(({ block, mask }, j) => {
      const k = blockIndex.get(block);
      if (((words[k] & mask) >>> 0) === mask) return; // maybe there: the script's
      next[k] = (next[k] | mask) >>> 0;
      const d = batch[j];
      const sub = ((d[0] << 8) | d[1]) % SUBS;
      let fields = bySub.get(sub); if (!fields) bySub.set(sub, (fields = []));
      fields.push(d, id);
    });
    const set = [];
    for (const [block, k] of blockIndex) if (next[k] !== words[k]) set.push('SET', 'u32', `#${block}`, next[k]);
    const m = redis.multi();
    m.time();
    m.hset(meta, `b${id}`, `cab12:${Date.now()}`);
    if (set.length) m.call('BITFIELD', f, ...set);
    for (const [sub, fields] of bySub) { m.hset(`${base}:${bucket}:${sub}`, ...fields); m.expireat(`${base}:${bucket}:${sub}`, (bucket + 1) * WIDTH + TTL); }
    m.hincrby(meta, 'n', batch.length);
    const out = await m.exec();
    if (out === null) throw new Error('the EXEC was aborted: nothing else writes this filter here');
  };
};
const results = {};
for (let round = 1; round <= 2; round++) {
  for (const base of [`s${round}`, `n${round}`, `x${round}`, `o${round}`, `l${round}`, `w${round}`]) await prefill(base);
  results[`script ${round}`] = await measure('claim script (claim_markers.lua)', script(`s${round}`));
  results[`native ${round}`] = await measure('native: record, filter bits, HSETNX per digest, EXPIREAT per hash', native(`n${round}`, true));
  results[`nofilter ${round}`] = await measure('native without the filter bits', native(`x${round}`, false));
  results[`lean ${round}`] = await measure('lean script: HSETNX per digest, filter words from packed offsets', lean(`l${round}`));
  results[`onebit ${round}`] = await measure('native with one filter bit per digest (a filter format with k = 1)', native(`o${round}`, true, 1));
  results[`watch ${round}`] = await measure('optimistic: WATCH, filter words read, one MULTI of HSET per hash', watched(`w${round}`));
}
console.log(JSON.stringify(results));
redis.disconnect(); await server.stop();
