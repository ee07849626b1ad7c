import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, type BatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { testWorkerSettings } from '@tally/testkit';
import { runAtomicBatch } from '../src/atomic-batch.js';
import type { BatchLog } from '../src/batch-log.js';
import { CountTtlRefresh, countRefreshIntervalS, countTtlOf } from '../src/count-ttl.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet: BatchLog = { warn() {}, error() {} };

describe('count TTL refresh (pure)', () => {
  it('refreshes a key when this thread has not within the interval: an hour, or a tenth of a shorter TTL', () => {
    expect(countRefreshIntervalS(2_592_000)).to.equal(3_600);
    expect(countRefreshIntervalS(600)).to.equal(60);
    expect(countRefreshIntervalS(9)).to.equal(0);
    const refresh = new CountTtlRefresh(600);
    expect(refresh.ttlS, 'the TTL given covers the interval').to.equal(660);
    expect(refresh.due(['a', 'b', 'c'], 1_000)).to.equal('111');
    expect(refresh.due(['a', 'b', 'c'], 1_000 + 59_999), 'none due within the interval').to.equal('');
    expect(refresh.due(['d', 'a'], 1_000 + 30_000), 'a new key is due, trailing not-due ones are dropped').to.equal('1');
    expect(refresh.due(['a', 'd', 'b'], 1_000 + 60_000), 'a and b are due again, d is not').to.equal('101');
  });

  it('with a TTL under ten seconds every key is due on every write', () => {
    const refresh = new CountTtlRefresh(5);
    expect(refresh.ttlS).to.equal(5);
    expect(refresh.due(['a', 'b'], 0)).to.equal('11');
    expect(refresh.due(['a', 'b'], 1)).to.equal('11');
  });

  it('forgets the least recently refreshed keys past its bound, which are then simply due again', () => {
    const refresh = new CountTtlRefresh(600, 3);
    refresh.due(['a', 'b', 'c'], 0);
    refresh.due(['d'], 1_000); // over the bound: a, the least recently refreshed, is forgotten
    expect(refresh.size).to.equal(3);
    expect(refresh.due(['b', 'c', 'd', 'a'], 2_000), 'only the forgotten a is due').to.equal('0001');
  });
});

type TestTask = BatchTask & { readonly ids: readonly string[] };

function taskOf(runId: string, vshard: number, skus: readonly string[]): TestTask {
  const ids = skus.map((_, i) => `${runId}-${randomUUID()}-${i}`);
  return { vshard, batchId: randomUUID(), ids, changes: skus.map((sku) => [[sku, 2]]) };
}

for (const mode of ['two-step', 'atomic'] as const) {
  describe(`count TTL refresh against a real Redis (${mode})`, function () {
    this.timeout(30_000);
    let redis: Redis;
    let client: Redis;
    let prefix: string;
    let runId: string;
    let settings: WorkerSettings;
    const run = (task: BatchTask) => (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client, settings, task, quiet);

    beforeEach(() => {
      runId = randomBytes(4).toString('hex');
      prefix = `t.countttl.${runId}:`;
      // A TTL no other test in this process uses (this thread's refresh memory starts empty for it), with a 2 s interval.
      settings = testWorkerSettings({ redisUrl: REDIS_URL, prefix, mode, claimToken: 'c1', countTtlS: mode === 'atomic' ? 20 : 21 });
      redis = new Redis(REDIS_URL);
      client = createRedisClient(REDIS_URL, 'test-count-ttl');
    });
    afterEach(async () => {
      const keys = await redis.keys(`${prefix}*`);
      if (keys.length > 0) await redis.del(...keys);
      redis.disconnect();
      client.disconnect();
    });

    it('sets the TTL on a new key and when due, leaves it alone between refreshes, and never leaves a recreated key without one', async () => {
      const ttlS = countTtlOf(settings.countTtlS).ttlS;
      expect(ttlS, 'the TTL plus a 2 s interval').to.equal(settings.countTtlS + 2);
      const [hot, gone] = [countKey(prefix, 3, 'HOT'), countKey(prefix, 3, 'GONE')];
      await run(taskOf(runId, 3, ['HOT', 'GONE']));
      expect(await redis.ttl(hot), 'a new key gets the TTL plus the interval').to.be.within(ttlS - 1, ttlS);
      // Shorten one by hand and delete the other: a write within the interval must not touch the TTL (no EXPIRE)...
      await redis.expire(hot, 12);
      await redis.del(gone);
      await run(taskOf(runId, 3, ['HOT', 'GONE']));
      expect(await redis.get(hot)).to.equal('4');
      expect(await redis.ttl(hot), 'not refreshed within the interval').to.be.within(11, 12);
      // ...but a key the INCRBY created again gets it at once, whatever the interval says.
      expect(await redis.get(gone)).to.equal('2');
      expect(await redis.ttl(gone), 'a recreated key is never left without a TTL').to.be.within(ttlS - 1, ttlS);
      // Once the interval has passed, the next write refreshes the existing key.
      await new Promise((resolve) => setTimeout(resolve, 2_100));
      await run(taskOf(runId, 3, ['HOT']));
      expect(await redis.get(hot)).to.equal('6');
      expect(await redis.ttl(hot), 'refreshed once due').to.be.within(ttlS - 1, ttlS);
    });
  });
}
