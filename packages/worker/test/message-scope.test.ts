import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, countScanPattern, shardOf, type BatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { readMarkers, testWorkerSettings } from '@tally/testkit';
import { runAtomicBatch } from '../src/atomic-batch.js';
import type { BatchLog } from '../src/batch-log.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';
import { wholeMessagesOf } from './whole-messages.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet: BatchLog = { warn() {}, error() {} };
const SHARDS = 16;

const wholeMessages = (runId: string, markerShard: number, count: number) => wholeMessagesOf(runId, markerShard, count, SHARDS);

for (const mode of ['two-step', 'atomic'] as const) {
  describe(`message-scoped markers against a real Redis (${mode})`, function () {
    this.timeout(30_000);
    let redis: Redis;
    let client: Redis;
    let prefix: string;
    let runId: string;
    let settings: WorkerSettings;
    const run = (task: BatchTask) => (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client, settings, task, quiet);

    beforeEach(() => {
      runId = randomBytes(4).toString('hex');
      prefix = `t.msgscope.${runId}:`;
      settings = testWorkerSettings({ redisUrl: REDIS_URL, prefix, mode, markerScope: 'message', virtualShards: SHARDS });
      redis = new Redis(REDIS_URL);
      client = createRedisClient(REDIS_URL, 'test-message-scope');
    });
    afterEach(async () => {
      const keys = await redis.keys(`${prefix}*`);
      if (keys.length > 0) await redis.del(...keys);
      redis.disconnect();
      client.disconnect();
    });

    it("writes each change to its SKU's own shard, one marker per message on the marker shard; a redelivery is all duplicates", async () => {
      const task = wholeMessages(runId, 1, 40);
      const first = await run(task);
      expect([...first.marked], 'every message new').to.deep.equal(new Array(40).fill(0));
      const expected = new Map<string, number>();
      for (const part of task.changes) for (const [sku, delta] of part) expected.set(sku, (expected.get(sku) ?? 0) + delta);
      // Exactly those count keys, on as many shards as the SKUs span: none on the marker shard (1) for a SKU of another.
      const written = await redis.keys(countScanPattern(prefix));
      expect(written.sort(), 'the count keys written').to.deep.equal([...expected.keys()].map((sku) => countKey(prefix, shardOf(sku, SHARDS), sku)).sort());
      const shardsWritten = new Set(written.map((key) => /c:\{(\d+)\}:/.exec(key)![1]));
      expect(shardsWritten.size, "written on the SKUs' shards, not only the marker shard").to.be.greaterThan(3);
      for (const [sku, total] of expected) {
        expect(await redis.get(countKey(prefix, shardOf(sku, SHARDS), sku)), `${sku} on its own shard`).to.equal(String(total));
      }
      const { done } = await readMarkers(redis, prefix);
      expect(done.size, 'one marker per message').to.equal(40);
      for (const entry of done) expect(entry.split(':')[0], 'on the marker shard').to.equal('1');

      const again = await run({ ...task, batchId: randomUUID() });
      expect([...again.marked], 'a redelivery is all duplicates').to.deep.equal(new Array(40).fill(1));
      for (const [sku, total] of expected) expect(await redis.get(countKey(prefix, shardOf(sku, SHARDS), sku))).to.equal(String(total));
    });

    it('refuses nothing silently: a foreign value in one count key leaves that whole message uncounted and unmarked', async () => {
      const task = wholeMessages(runId, 2, 5);
      const poisoned = task.changes[3]![1]![0];
      await redis.set(countKey(prefix, shardOf(poisoned, SHARDS), poisoned), 'not-a-number');
      const result = await run(task);
      // Refused: flag 0 with a refusal (the coordinator dead-letters it as count-refused).
      expect(result.refusals.map((refusal) => refusal.part)).to.include(3);
      const { done } = await readMarkers(redis, prefix);
      expect(done.size, 'the refused message has no marker').to.equal(task.ids.length - result.refusals.length);
      // The refused message's other changes were not counted either: its replay counts it whole, once.
      const [sku] = task.changes[3]![0]!;
      const others = task.changes.filter((_, i) => !result.refusals.some((refusal) => refusal.part === i)).flat();
      const expected = others.filter(([other]) => other === sku).reduce((sum, [, delta]) => sum + delta, 0);
      expect(Number((await redis.get(countKey(prefix, shardOf(sku, SHARDS), sku))) ?? 0)).to.equal(expected);
    });
  });
}
