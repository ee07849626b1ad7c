/**
 * A refused count at the worker: a part whose increment Redis refuses (a
 * foreign value in a count key, a wrong type, a 64-bit overflow) counts
 * nothing and occupies no marker, while the batch's other parts are counted
 * and marked; the foreign key is left exactly as it was; a rerun of the same
 * batch gets the same answer from its receipt; and once the key is repaired,
 * the replayed parts count the refused ones once and skip the rest.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, type BatchResult, type BatchTask, type WorkerSettings } from '@tally/shared';
import { markerEntry, readMarkers, testWorkerSettings } from '@tally/testkit';
import { createRedisClient } from '@tally/runtime';
import type { BatchLog } from '../src/batch-log.js';
import { runAtomicBatch } from '../src/atomic-batch.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';
import { monitorFence } from './monitor-fence.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const INT64_MAX = 9223372036854775807n;

type Mode = WorkerSettings['mode'];
const run = (mode: Mode) => (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch);

interface Poison {
  readonly name: string;
  /** Puts the foreign value in the key; returns how to read it back unchanged. */
  plant(redis: Redis, key: string): Promise<void>;
  read(redis: Redis, key: string): Promise<unknown>;
  /** The delta each poisoned change carries (an overflow needs a positive one). */
  readonly delta: number;
  readonly error: RegExp;
}

const POISONS: readonly Poison[] = [
  { name: 'a string that is not an integer', plant: async (r, k) => void (await r.set(k, 'abc')), read: (r, k) => r.get(k), delta: 3, error: /not an integer/ },
  { name: 'a hash (WRONGTYPE)', plant: async (r, k) => void (await r.hset(k, 'f', 'v')), read: (r, k) => r.hgetall(k), delta: 3, error: /^WRONGTYPE/ },
  {
    name: 'a count at 2^63-1 (overflow)',
    plant: async (r, k) => void (await r.set(k, INT64_MAX.toString())),
    read: (r, k) => r.get(k),
    delta: 5,
    error: /overflow/,
  },
];

describe('count refusals against a real Redis (both modes)', function () {
  this.timeout(60_000);
  let redis: Redis;
  let client: Redis;
  let prefix: string;
  const logged: Array<Record<string, unknown>> = [];
  const log: BatchLog = { warn() {}, error: (fields) => void logged.push(fields) };

  beforeEach(() => {
    prefix = `t.refuse.${randomBytes(4).toString('hex')}:`;
    redis = new Redis(REDIS_URL);
    client = createRedisClient(REDIS_URL, 'test-refusals');
    logged.length = 0;
  });
  afterEach(async () => {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
    client.disconnect();
  });

  const settings = (mode: Mode): WorkerSettings => testWorkerSettings({ redisUrl: REDIS_URL, prefix, mode });

  /** 12 parts on shard 4: every part adds 1 to GOOD and 2 to its own SKU; parts 3 and 8 also touch BAD (poisoned). */
  function batch(poisonDelta: number): BatchTask {
    const ids: string[] = [];
    const changes: Array<Array<[string, number]>> = [];
    for (let i = 0; i < 12; i++) {
      ids.push(`${prefix}m${i}`);
      const part: Array<[string, number]> = [
        ['GOOD', 1],
        [`OWN${i}`, 2],
      ];
      // BAD last: the part's earlier increments succeed and must be taken back.
      if (i === 3 || i === 8) part.push(['BAD', poisonDelta]);
      changes.push(part);
    }
    return { vshard: 4, batchId: randomUUID(), ids, changes };
  }

  async function count(sku: string): Promise<string | null> {
    return redis.get(countKey(prefix, 4, sku));
  }

  async function markers(task: BatchTask): Promise<boolean[]> {
    const { done } = await readMarkers(redis, prefix);
    return task.ids!.map((id) => done.has(markerEntry(4, id)));
  }

  function expectRefusedParts(result: BatchResult, poison: Poison): void {
    expect(result.refusals.map((r) => r.part)).to.deep.equal([3, 8]);
    for (const refusal of result.refusals) {
      expect(refusal.key).to.equal(countKey(prefix, 4, 'BAD'));
      expect(refusal.sku).to.equal('BAD');
      expect(refusal.delta).to.equal(String(poison.delta));
      expect(refusal.error).to.match(poison.error);
    }
  }

  for (const mode of ['two-step', 'atomic'] as const) {
    for (const poison of POISONS) {
      it(`${mode}, ${poison.name}: the refused parts count nothing and get no marker; the rest is counted and marked; the foreign key is untouched`, async () => {
        const bad = countKey(prefix, 4, 'BAD');
        await poison.plant(redis, bad);
        const before = await poison.read(redis, bad);
        const task = batch(poison.delta);

        const result = await run(mode)(client, settings(mode), task, log);
        expectRefusedParts(result, poison);
        expect([...result.marked], 'refused parts are not duplicates').to.deep.equal(new Array(12).fill(0));
        expect(await count('GOOD'), 'GOOD counted for the 10 accepted parts only (all or nothing per part)').to.equal('10');
        expect(await count('OWN3'), "a refused part's other increments were taken back").to.equal(null);
        expect(await count('OWN8')).to.equal(null);
        expect(await count('OWN4')).to.equal('2');
        expect(await markers(task), 'markers for the accepted parts only').to.deep.equal(task.ids!.map((_, i) => i !== 3 && i !== 8));
        expect(await poison.read(redis, bad), 'the foreign value is left exactly as it was').to.deep.equal(before);
        expect(await redis.ttl(bad), 'no EXPIRE on a foreign key').to.equal(-1);
        expect(await redis.ttl(countKey(prefix, 4, 'GOOD')), 'a counted key gets its TTL').to.be.greaterThan(2_500_000);
        expect(logged.filter((f) => f.key === bad && f.delta === String(poison.delta)).length, 'logged with key and delta').to.equal(2);

        // A rerun of the same batch (a dead thread, a lost reply): the receipt gives the same answer, nothing is written again.
        const rerun = await run(mode)(client, settings(mode), task, log);
        expectRefusedParts(rerun, poison);
        expect(await count('GOOD')).to.equal('10');
        expect(await markers(task)).to.deep.equal(task.ids!.map((_, i) => i !== 3 && i !== 8));

        // The key repaired, the dead-lettered messages replayed: in a new batch, all 12 parts as the daemon sees them again.
        await redis.del(bad);
        const replay = await run(mode)(client, settings(mode), { ...task, batchId: randomUUID() }, log);
        expect(replay.refusals).to.deep.equal([]);
        expect([...replay.marked], 'the accepted parts are skipped by their markers').to.deep.equal(task.ids!.map((_, i) => (i === 3 || i === 8 ? 0 : 1)));
        expect(await count('GOOD'), 'the refused parts counted once').to.equal('12');
        expect(await count('BAD')).to.equal(String(2 * poison.delta));
        expect(await count('OWN3')).to.equal('2');
        expect(await markers(task)).to.deep.equal(task.ids!.map(() => true));
      });
    }

    it(`${mode}: a batch with no refusal takes the usual path, one INCRBY per SKU (MONITOR)`, async () => {
      // The test's connections ready first, and no extra one: a command of ours (a ready-check
      // INFO) that reaches MONITOR's connection in the same read as its OK is taken by ioredis
      // for a reply ("Command queue state error", seen in CI).
      await Promise.all([redis.ping(), client.ping()]);
      const monitor = await redis.monitor();
      const incrs: string[] = [];
      monitor.on('monitor', (_time: string, args: string[]) => {
        if (args[0]?.toLowerCase() === 'incrby' && args[1]?.startsWith(prefix)) incrs.push(args[1]);
      });
      try {
        const task = batch(1);
        const result = await run(mode)(client, settings(mode), task, log);
        await monitorFence(monitor, redis, `${prefix}monitor-fence`);
        expect(result.refusals).to.deep.equal([]);
        expect(incrs.length, 'GOOD, BAD and 12 OWN keys').to.equal(14);
        expect(await count('GOOD')).to.equal('12');
      } finally {
        monitor.disconnect();
      }
    });
  }
});
