import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { bucketOf, countKey, markerBucketKey, markerDigest, subBucketOf, type BatchTask, type WorkerSettings } from '@tally/shared';
import { markerEntry, readMarkers, startProxy, testWorkerSettings } from '@tally/testkit';
import { atomicBatchArgs, runAtomicBatch } from '../src/atomic-batch.js';
import { createRedisClient } from '@tally/runtime';
import type { BatchLog } from '../src/batch-log.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';

/** Tasks built by the tests carry the ids (the coordinator sends digests only). */
type TestTask = BatchTask & { readonly ids: readonly string[] };
const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet: BatchLog = { warn() {}, error() {} };

function settingsFor(prefix: string, mode: WorkerSettings['mode'] = 'atomic', claimToken = 'a1'): WorkerSettings {
  return testWorkerSettings({ redisUrl: REDIS_URL, prefix, mode, claimToken });
}

function taskFor(runId: string, vshard = 5, parts = 60): TestTask {
  const ids: string[] = [];
  const changes: Array<Array<[string, number]>> = [];
  for (let i = 0; i < parts; i++) {
    ids.push(`${runId}-m${i}`);
    changes.push([
      [`S${i % 7}`, 1 + (i % 3)],
      [`T${i % 5}`, -2],
    ]);
  }
  return { vshard, batchId: randomUUID(), ids, changes };
}

/** The same parts in a new batch, as after a redelivery: a new batch id, so no receipt answers for it. */
function redelivered(task: BatchTask): BatchTask {
  return { ...task, batchId: randomUUID() };
}

function expectedCounts(task: TestTask, counted: (i: number) => boolean = () => true): Map<string, bigint> {
  const sums = new Map<string, bigint>();
  task.changes.forEach((part, i) => {
    if (!counted(i)) return;
    for (const [sku, delta] of part) sums.set(sku, (sums.get(sku) ?? 0n) + BigInt(delta));
  });
  return sums;
}

async function countsIn(redis: Redis, prefix: string, task: TestTask): Promise<Map<string, bigint>> {
  const result = new Map<string, bigint>();
  for (const part of task.changes) {
    for (const [sku] of part) {
      const value = await redis.get(countKey(prefix, task.vshard, sku));
      if (value !== null) result.set(sku, BigInt(value));
    }
  }
  return result;
}

async function markersIn(redis: Redis, prefix: string, task: TestTask): Promise<number> {
  const { done } = await readMarkers(redis, prefix);
  return task.ids.filter((id) => done.has(markerEntry(task.vshard, id))).length;
}

/** The hash a marker written now lands in (bucket of the server's clock). */
async function markerHashNow(redis: Redis, prefix: string, vshard: number, id: string, settings: WorkerSettings): Promise<string> {
  const [seconds] = await redis.time();
  return markerBucketKey(prefix, vshard, bucketOf(Number(seconds), settings.markerBucketS), subBucketOf(markerDigest(id), settings.markerSubBuckets));
}

/** The Redis Cluster hash tag of a key: what decides its slot. */
function hashTag(key: string): string {
  const open = key.indexOf('{');
  if (open < 0) return key;
  const close = key.indexOf('}', open + 1);
  if (close < 0 || close === open + 1) return key;
  return key.slice(open + 1, close);
}

describe('atomic batch against a real Redis', function () {
  this.timeout(60_000);
  let redis: Redis;
  let client: Redis;
  let prefix: string;
  let runId: string;

  beforeEach(() => {
    runId = randomBytes(4).toString('hex');
    prefix = `t.atomic.${runId}:`;
    redis = new Redis(REDIS_URL);
    client = createRedisClient(REDIS_URL, 'test-atomic');
  });
  afterEach(async () => {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
    client.disconnect();
  });

  it('counts a batch exactly and occupies every marker in one call; the same batch again is all duplicates', async () => {
    const task = taskFor(runId);
    const first = await runAtomicBatch(client, settingsFor(prefix), task, quiet);
    expect([...first.marked]).to.deep.equal(new Array(task.ids.length).fill(0));
    expect(first.occupationFailures, 'no window to fail in').to.equal(0);
    expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
    expect(await markersIn(redis, prefix, task)).to.equal(task.ids.length);
    const ttl = await redis.ttl(countKey(prefix, task.vshard, 'S0'));
    // The count TTL plus the refresh interval (count-ttl.ts): never below the TTL between two refreshes.
    expect(ttl, 'count TTL set').to.be.within(2_592_000 + 3_600 - 5, 2_592_000 + 3_600);
    // The bucket's end plus the marker TTL: at least the TTL, at most one bucket width more.
    const markerHash = await markerHashNow(redis, prefix, task.vshard, task.ids[0]!, settingsFor(prefix));
    expect(await redis.hget(markerHash, markerDigest(task.ids[0]!) as unknown as string), 'the marker is a field of the bucket hash').to.equal('1');
    expect(await redis.ttl(markerHash), 'marker TTL set').to.be.within(595, 900);
    expect(await redis.object('ENCODING', markerHash), 'a small hash stays a listpack').to.equal('listpack');

    const again = await runAtomicBatch(client, settingsFor(prefix), redelivered(task), quiet);
    expect([...again.marked]).to.deep.equal(new Array(task.ids.length).fill(1));
    expect(await countsIn(redis, prefix, task), 'nothing added twice').to.deep.equal(expectedCounts(task));

    // A rerun of the same batch (same id: a dead thread, a lost reply) gets the first answer back from its receipt.
    const rerun = await runAtomicBatch(client, settingsFor(prefix), task, quiet);
    expect([...rerun.marked], 'the rerun reports the parts as the first run counted them').to.deep.equal(new Array(task.ids.length).fill(0));
    expect(await countsIn(redis, prefix, task), 'and adds nothing').to.deep.equal(expectedCounts(task));
  });

  it('counts only the parts whose marker is absent, and the same id twice in one batch once', async () => {
    const task = taskFor(runId, 2, 20);
    // Parts 0..4 were counted before; part 7 appears again at the end of the batch.
    await runAtomicBatch(
      client,
      settingsFor(prefix),
      { vshard: 2, batchId: randomUUID(), ids: task.ids.slice(0, 5), changes: task.changes.slice(0, 5).map(() => []) },
      quiet,
    );
    const withRepeat: TestTask = { vshard: 2, batchId: randomUUID(), ids: [...task.ids, task.ids[7]!], changes: [...task.changes, task.changes[7]!] };
    const result = await runAtomicBatch(client, settingsFor(prefix), withRepeat, quiet);
    const expectedMarked = withRepeat.ids.map((_, i) => (i < 5 || i === 20 ? 1 : 0));
    expect([...result.marked]).to.deep.equal(expectedMarked);
    expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task, (i) => i >= 5));
  });

  it('adds a SKU exactly across several new parts, past 2^53, with deltas of both signs', async () => {
    const max = Number.MAX_SAFE_INTEGER;
    const task: TestTask = {
      vshard: 9,
      batchId: randomUUID(),
      ids: ['a', 'b', 'c', 'd', 'e'].map((s) => `${runId}-${s}`),
      changes: [
        [
          ['BIG', max],
          ['NEG', -max],
          ['ZERO', 5],
        ],
        [
          ['BIG', max],
          ['NEG', -max],
          ['ZERO', -5],
        ],
        [
          ['BIG', 1],
          ['NEG', -1],
        ],
        [['BIG', -3]],
        [['BIG', max]],
      ],
    };
    const result = await runAtomicBatch(client, settingsFor(prefix), task, quiet);
    expect(result.refusals).to.deep.equal([]);
    const counts = await countsIn(redis, prefix, task);
    expect(counts.get('BIG')).to.equal(3n * BigInt(max) + 1n - 3n);
    expect(counts.get('NEG')).to.equal(-2n * BigInt(max) - 1n);
    expect(counts.get('ZERO'), 'a sum that cancels out is still written (and its TTL refreshed)').to.equal(0n);
  });

  it('fails the whole batch on a script refusal and writes nothing: no count, no marker', async () => {
    const task: TestTask = { vshard: 1, batchId: randomUUID(), ids: [`${runId}-ok`, `${runId}-bad`], changes: [[['OK', 2]], [['BAD', 1.5]]] };
    let thrown: unknown = null;
    try {
      await runAtomicBatch(client, settingsFor(prefix), task, quiet);
    } catch (error) {
      thrown = error;
    }
    expect(thrown, 'the batch failed').to.be.instanceOf(Error);
    expect((thrown as Error).message).to.match(/^TALLY_SCRIPT_ARGS/);
    expect(await redis.exists(countKey(prefix, 1, 'OK'), countKey(prefix, 1, 'BAD'))).to.equal(0);
    expect(await markersIn(redis, prefix, task)).to.equal(0);
  });

  describe("the all-parts sums ('sums' layout): duplicates taken off exactly", () => {
    const max = Number.MAX_SAFE_INTEGER;
    const part = (id: string, changes: Array<[string, number]>) => ({ id: `${runId}-${id}`, changes });
    type Part = ReturnType<typeof part>;
    const batchOf = (vshard: number, parts: Part[]): TestTask => ({
      vshard,
      batchId: randomUUID(),
      ids: parts.map((p) => p.id),
      changes: parts.map((p) => p.changes),
    });
    const count = async (vshard: number, sku: string) => redis.get(countKey(prefix, vshard, sku));

    it('sends the sums over all parts as exact decimal strings and the changes naming each key; a delta that is not a safe integer sends the parts only', () => {
      const task = batchOf(3, [
        part('a', [
          ['BIG', max],
          ['S', -2],
        ]),
        part('b', [['BIG', max]]),
        part('c', [
          ['S', 5],
          ['S', 1],
        ]),
      ]);
      const args = atomicBatchArgs(settingsFor(prefix), task, 'batch-1').map((arg) => (Buffer.isBuffer(arg) ? 'digest' : String(arg)));
      const argv = args.slice(2 + Number(args[1]));
      // TTLs, n, m, bucket width and sub-buckets, then the layout, the keys whose TTL is due (both: new to this
      // thread), no filter (part-scoped markers), no bucket probed by the thread, the sums (BIG, S) and how many
      // changes name each.
      expect(argv.slice(2, 15)).to.deep.equal(['3', '2', '300', '256', 'sums', '11', '0', '', '', String(2n * BigInt(max)), '4', '2', '3']);
      expect(argv.slice(15)).to.deep.equal(['digest', `1:${max},2:-2`, 'digest', `1:${max}`, 'digest', '2:5,2:1']);
      const bad = atomicBatchArgs(settingsFor(prefix), batchOf(3, [part('a', [['X', 1.5]])]), 'batch-2');
      const badArgv = bad.slice(2 + Number(bad[1])).map((arg) => (Buffer.isBuffer(arg) ? 'digest' : String(arg)));
      expect(badArgv.slice(6)).to.deep.equal(['parts', '1', '0', '', '', 'digest', '1:1.5']);
    });

    it('takes duplicates off a sum past 2^53 exactly (summed from the new parts): one redelivered, one twice in the batch', async () => {
      const a = part('a', [
        ['BIG', max],
        ['S', 1],
      ]);
      await runAtomicBatch(client, settingsFor(prefix), batchOf(6, [a]), quiet);
      const b = part('b', [
        ['BIG', max],
        ['S', 2],
        ['HUGE', max],
      ]);
      const c = part('c', [
        ['BIG', -5],
        ['HUGE', max],
      ]);
      const result = await runAtomicBatch(client, settingsFor(prefix), batchOf(6, [a, b, c, b]), quiet);
      expect([...result.marked]).to.deep.equal([1, 0, 0, 1]);
      expect(result.refusals).to.deep.equal([]);
      expect(await count(6, 'BIG')).to.equal(String(2n * BigInt(max) - 5n));
      expect(await count(6, 'S')).to.equal('3');
      expect(await count(6, 'HUGE')).to.equal(String(2n * BigInt(max)));
    });

    it('sends a sum past 2^53 that no duplicate names as it is, next to a duplicate taken off a safe sum', async () => {
      const a = part('a', [['S', 4]]);
      await runAtomicBatch(client, settingsFor(prefix), batchOf(10, [a]), quiet);
      const b = part('b', [
        ['HUGE', max],
        ['S', 1],
      ]);
      const c = part('c', [
        ['HUGE', max],
        ['HUGE', -2],
      ]);
      const result = await runAtomicBatch(client, settingsFor(prefix), batchOf(10, [b, a, c]), quiet);
      expect([...result.marked]).to.deep.equal([0, 1, 0]);
      expect(await count(10, 'HUGE')).to.equal(String(2n * BigInt(max) - 2n));
      expect(await count(10, 'S')).to.equal('5');
    });

    it('takes duplicates off safe sums, and writes no key that only duplicates name (no 0 created, no TTL refreshed)', async () => {
      const a = part('a', [
        ['ONLY', 4],
        ['S', 10],
      ]);
      await runAtomicBatch(client, settingsFor(prefix), batchOf(7, [a]), quiet);
      await redis.del(countKey(prefix, 7, 'ONLY'));
      const b = part('b', [
        ['S', -3],
        ['T', 7],
      ]);
      const c = part('c', [['T', -7]]);
      const result = await runAtomicBatch(client, settingsFor(prefix), batchOf(7, [b, a, c, a, b]), quiet);
      expect([...result.marked]).to.deep.equal([0, 1, 0, 1, 1]);
      expect(await redis.exists(countKey(prefix, 7, 'ONLY')), 'named by duplicates only: not written').to.equal(0);
      expect(await count(7, 'S')).to.equal('7');
      expect(await count(7, 'T'), 'new parts that cancel out are still written').to.equal('0');
    });

    it('takes a duplicate off a sum past 2^63 and isolates the part that overflows: the others counted exactly, one refusal', async () => {
      const before = part('x', [['WIDE', 1]]);
      await runAtomicBatch(client, settingsFor(prefix), batchOf(8, [before]), quiet);
      // 1,024 parts of 2^53-1 fit in 2^63-1 (with the 1 already there); the 1,025th overflows. The sum of all parts leaves 64 bits.
      const parts = [before];
      for (let i = 0; i < 1025; i++)
        parts.push(
          part(`p${i}`, [
            ['WIDE', max],
            ['OK', 1],
          ]),
        );
      const result = await runAtomicBatch(client, settingsFor(prefix), batchOf(8, parts), quiet);
      expect(result.marked[0]).to.equal(1);
      expect(result.refusals.map((r) => r.part)).to.deep.equal([1025]);
      expect(result.refusals[0]!.error).to.match(/overflow/);
      expect(await count(8, 'WIDE')).to.equal(String(1024n * BigInt(max) + 1n));
      expect(await count(8, 'OK'), 'the refused part counted nothing').to.equal('1024');
      expect(await markersIn(redis, prefix, batchOf(8, parts)), 'no marker for the refused part').to.equal(1025);
    });

    it('isolates the parts when a sum over all parts leaves 64 bits and no duplicate is there (INCRBY refuses the sum itself)', async () => {
      const parts: Part[] = [];
      for (let i = 0; i < 1025; i++) parts.push(part(`q${i}`, [['WIDE', max]]));
      const result = await runAtomicBatch(client, settingsFor(prefix), batchOf(11, parts), quiet);
      expect(result.refusals.map((r) => r.part)).to.deep.equal([1024]);
      expect(result.refusals[0]!.error).to.match(/overflow/);
      expect(await count(11, 'WIDE')).to.equal(String(1024n * BigInt(max)));
    });

    it('with a duplicate and a foreign value in a count key: the refused part counts nothing, the others count once', async () => {
      const a = part('a', [['GOOD', 1]]);
      await runAtomicBatch(client, settingsFor(prefix), batchOf(9, [a]), quiet);
      await redis.set(countKey(prefix, 9, 'BAD'), 'abc');
      const b = part('b', [
        ['GOOD', 1],
        ['BAD', 3],
      ]);
      const c = part('c', [['GOOD', 1]]);
      const result = await runAtomicBatch(client, settingsFor(prefix), batchOf(9, [a, b, c]), quiet);
      expect([...result.marked]).to.deep.equal([1, 0, 0]);
      expect(result.refusals.map((r) => [r.part, r.sku, r.delta])).to.deep.equal([[1, 'BAD', '3']]);
      expect(await count(9, 'GOOD')).to.equal('2');
      expect(await count(9, 'BAD')).to.equal('abc');
      expect(await redis.ttl(countKey(prefix, 9, 'BAD')), 'no EXPIRE on a foreign key').to.equal(-1);
    });
  });

  it('keys every call to one hash slot: receipt, markers and counts all carry the shard tag', () => {
    const task = taskFor(runId, 13, 30);
    const args = atomicBatchArgs(settingsFor(prefix), task, 'batch-1');
    const numKeys = Number(args[1]);
    // The receipt, the shard's marker base (the script derives its bucket hashes from it, same tag) and 12 count keys.
    expect(numKeys).to.equal(1 + 1 + 12);
    const keys = args.slice(2, 2 + numKeys).map(String);
    expect(new Set(keys.map(hashTag))).to.deep.equal(new Set(['13']));
  });

  it('answers a retry after a lost reply from the receipt: the new parts are not reported as duplicates', async () => {
    const proxy = await startProxy(6379);
    const viaProxy = createRedisClient(`redis://127.0.0.1:${proxy.port}`, 'test-atomic-proxy');
    viaProxy.on('error', () => {});
    try {
      let cut = false;
      proxy.inspect = (chunk) => {
        // The script reaches Redis and runs; its reply never arrives.
        if (!cut && /evalsha/i.test(chunk.toString('latin1'))) {
          cut = true;
          return 'cut-after';
        }
        return 'forward';
      };
      const task = taskFor(runId, 6, 40);
      const result = await runAtomicBatch(viaProxy, settingsFor(prefix), task, quiet);
      expect(cut, 'the reply was cut').to.equal(true);
      expect(result.writeRetries, 'the call failed at least once').to.be.at.least(1);
      expect([...result.marked], 'every part reported new, as it was').to.deep.equal(new Array(40).fill(0));
      expect(await countsIn(redis, prefix, task), 'written once').to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(40);
    } finally {
      viaProxy.disconnect();
      await proxy.close();
    }
  });

  it('waits out a Redis outage and then counts exactly once', async () => {
    const proxy = await startProxy(6379);
    const viaProxy = createRedisClient(`redis://127.0.0.1:${proxy.port}`, 'test-atomic-proxy');
    viaProxy.on('error', () => {});
    try {
      const task = taskFor(runId, 8, 30);
      proxy.pause();
      setTimeout(() => proxy.resume(), 1_200);
      const result = await runAtomicBatch(viaProxy, settingsFor(prefix), task, quiet);
      expect(result.writeRetries).to.be.at.least(1);
      expect(await countsIn(redis, prefix, task)).to.deep.equal(expectedCounts(task));
      expect(await markersIn(redis, prefix, task)).to.equal(30);
    } finally {
      viaProxy.disconnect();
      await proxy.close();
    }
  });

  it('serialises two processes racing the same batch: one counts it, the other sees duplicates (two-step: held by the claim)', async () => {
    const other = createRedisClient(REDIS_URL, 'test-atomic-2');
    try {
      const rounds = 20;
      let atomicExcess = 0n;
      let twoStepExcess = 0n;
      for (let r = 0; r < rounds; r++) {
        for (const mode of ['atomic', 'two-step'] as const) {
          const task = taskFor(`${runId}-${mode}-${r}`, 3, 50);
          const run = mode === 'atomic' ? runAtomicBatch : runTwoStepBatch;
          const skuPrefix = `${mode}-${r}-`;
          const renamed: TestTask = { ...task, changes: task.changes.map((part) => part.map(([sku, d]) => [skuPrefix + sku, d] as [string, number])) };
          // Two daemons: two claim tokens, two batch ids.
          const [a, b] = await Promise.all([
            run(client, settingsFor(prefix, mode, 'a1'), renamed, quiet),
            run(other, settingsFor(prefix, mode, 'b2'), redelivered(renamed), quiet),
          ]);
          const counts = await countsIn(redis, prefix, renamed);
          let excess = 0n;
          for (const [sku, want] of expectedCounts(renamed)) {
            const diff = (counts.get(sku) ?? 0n) - want;
            excess += diff < 0n ? -diff : diff;
          }
          if (mode === 'atomic') {
            atomicExcess += excess;
            // Exactly one of the two saw each part as new.
            for (let i = 0; i < 50; i++) expect(a.marked[i]! + b.marked[i]!, `part ${i} counted by exactly one`).to.equal(1);
          } else {
            twoStepExcess += excess;
            // Exactly one counted each part; the other found it done or held by the first one's claim.
            for (let i = 0; i < 50; i++) expect([a.marked[i], b.marked[i]].filter((m) => m === 0).length, `part ${i} counted by exactly one`).to.equal(1);
          }
        }
      }
      expect(atomicExcess, 'atomic: the race adds nothing').to.equal(0n);
      expect(twoStepExcess, 'two-step: the claim makes the race add nothing either').to.equal(0n);
      console.log(`      racing the same batch ${rounds} times: atomic excess ${atomicExcess}, two-step ${twoStepExcess} units off the truth`);
    } finally {
      other.disconnect();
    }
  });
});
