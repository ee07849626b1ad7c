// Two versions of the atomic batch script, one private redis-server, alternating: Redis CPU per part of each
// (`node bench/results/notes/atomic-script-ab.mjs OLD.lua [OLD_MARKER_BUCKETS.lua]` after `pnpm build`; the old
// files from `git show <rev>:packages/worker/src/lua/...`). The new one is the build's. Batches of 1,000 parts over
// 4 marker shards, zipf SKUs, 1-8 changes a part, 3 % redeliveries; the bucket of now's hashes are made hashtables
// first, as at steady state. OLD_ARGS=parts when the old script takes each part as digest, k, k pairs (before 3551430).
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Redis } from 'ioredis';
import { startPrivateRedis, testWorkerSettings } from '@tally/testkit';
import { atomicBatchArgs, ATOMIC_BATCH } from '../../../packages/worker/dist/src/atomic-batch.js';
import { seededDraws } from './seeded-draws.mjs';

const [oldPath, oldIncludePath] = process.argv.slice(2);
if (!oldPath) throw new Error('usage: atomic-script-ab.mjs OLD.lua [OLD_MARKER_BUCKETS.lua]');
const lua = new URL('../../../packages/worker/dist/src/lua/include/', import.meta.url);
const include = (name, path) => readFileSync(path ?? new URL(`${name}.lua`, lua), 'utf8').trimEnd();
const oldSource = readFileSync(oldPath, 'utf8')
  .replace('-- @include marker_buckets', include('marker_buckets', oldIncludePath))
  .replace('-- @include count_apply', include('count_apply'));
const server = await startPrivateRedis();
const redis = new Redis(server.url);
const oldSha = await redis.script('LOAD', oldSource);
await redis.script('LOAD', ATOMIC_BATCH.source);
const settings = (prefix) => testWorkerSettings({ redisUrl: server.url, prefix, mode: 'atomic', markerScope: 'message', virtualShards: 1024 });
const NEW = settings('a:'), OLD = settings('b:');
const PARTS = 1000, BLOCK = 25, ROUNDS = Number(process.env.ROUNDS ?? 12);

const { random, sku } = seededDraws(1);
const recent = [];
function batch(vshard) {
  const digests = [], changes = [];
  for (let i = 0; i < PARTS; i++) {
    if (recent.length > 5000 && random() < 0.03) {
      const [digest, part] = recent[Math.floor(random() * recent.length)];
      digests.push(digest), changes.push(part);
      continue;
    }
    const part = Array.from({ length: 1 + Math.floor(random() * 8) }, () => [sku(), Math.floor(random() * 20) - 10 || 1]);
    const digest = randomBytes(16);
    digests.push(digest), changes.push(part), recent.push([digest, part]);
    if (recent.length > 20000) recent.shift();
  }
  return { vshard, batchId: randomUUID(), digests, changes };
}
// The new arguments, the parts rewritten as digest, k, k pairs for an old script that takes them so.
function oldArgs(task) {
  const args = atomicBatchArgs(OLD, { ...task, batchId: randomUUID() }, randomUUID());
  args[0] = oldSha;
  if (process.env.OLD_ARGS !== 'parts') return args;
  const n = task.changes.length, head = args.length - 2 * n, out = args.slice(0, head);
  for (let i = 0; i < n; i++) {
    const text = args[head + 2 * i + 1], changes = text === '' ? [] : text.split(',');
    out.push(args[head + 2 * i], changes.length, ...changes.flatMap((change) => change.split(':')));
  }
  return out;
}
const run = { new: (task) => redis.call('EVALSHA', ...atomicBatchArgs(NEW, task, task.batchId)), old: (task) => redis.call('EVALSHA', ...oldArgs(task)) };
const cpu = async () => {
  const info = await redis.info('cpu');
  return Number(/used_cpu_user:([\d.]+)/.exec(info)[1]) + Number(/used_cpu_sys:([\d.]+)/.exec(info)[1]);
};

for (let b = 0; b < 8; b++) for (const version of ['new', 'old']) await run[version](batch(b % 4));
// Steady state: the bucket of now's hashes past the listpack limit (hashtables), as with millions of markers.
for (const key of await redis.keys('*:mk:*')) {
  if (!/:\d+:\d+$/.test(key) || (await redis.type(key)) !== 'hash') continue;
  await redis.hset(key, ...Array.from({ length: 600 }, () => [randomBytes(16), '1']).flat());
}
for (let b = 0; b < 40; b++) for (const version of ['new', 'old']) await run[version](batch(b % 4));
const spent = { new: [], old: [] };
for (let round = 0; round < ROUNDS; round++) {
  const tasks = Array.from({ length: BLOCK }, (_, b) => batch(b % 4));
  for (const version of round % 2 ? ['old', 'new'] : ['new', 'old']) {
    const before = await cpu();
    for (const task of tasks) await run[version](task);
    spent[version].push(((await cpu()) - before) * 1e6 / (BLOCK * PARTS));
  }
}
const median = (values) => values.slice().sort((a, b) => a - b)[values.length >> 1];
for (const version of ['new', 'old']) console.log(`${version}: Redis CPU µs per part by round ${spent[version].map((v) => v.toFixed(2)).join(' ')}; median ${median(spent[version]).toFixed(2)}`);
console.log(`new ÷ old: ${(median(spent.new) / median(spent.old)).toFixed(3)}`);
await redis.quit();
await server.stop();
