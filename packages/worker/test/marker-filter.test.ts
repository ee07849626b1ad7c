import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import type { Redis } from 'ioredis';
import {
  filterBlocksFor,
  filterSlotOf,
  markerDigest,
  markerFilterBits,
  markerMetaKey,
  markersPerSubBucket,
  markerShardOf,
  subBucketsAfter,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { startPrivateRedis, testWorkerSettings, type PrivateRedis } from '@tally/testkit';
import { runAtomicBatch } from '../src/atomic-batch.js';
import type { BatchLog } from '../src/batch-log.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';

const quiet: BatchLog = { warn() {}, error() {} };
const SHARDS = 16;
const SHARD = 3;

/** `count` whole messages of marker shard SHARD, ids from `from` on. */
function messages(label: string, from: number, count: number): BatchTask & { ids: string[] } {
  const ids: string[] = [];
  for (let n = from; ids.length < count; n++) {
    const id = `${label}-${n}`;
    if (markerShardOf(markerDigest(id), SHARDS) === SHARD) ids.push(id);
  }
  return { vshard: SHARD, batchId: randomUUID(), ids, changes: ids.map((_, i) => [[`S${i % 50}`, 1]]) };
}

async function calls(redis: Redis, command: string): Promise<number> {
  const info = await redis.info('commandstats');
  return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
}

for (const mode of ['two-step', 'atomic'] as const) {
  describe(`marker filters (${mode}, message-scoped markers, a private Redis)`, function () {
    this.timeout(60_000);
    let server: PrivateRedis;
    let admin: Redis;
    let client: Redis;
    let settings: WorkerSettings;
    const run = (task: BatchTask) => (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client, settings, task, quiet);

    before(async () => {
      server = await startPrivateRedis();
      admin = server.admin();
      client = createRedisClient(server.url, 'test-marker-filter');
    });
    after(async () => {
      admin.disconnect();
      client.disconnect();
      await server.stop();
    });
    beforeEach(() => {
      settings = testWorkerSettings({
        redisUrl: server.url,
        prefix: `t.filter.${randomUUID().slice(0, 8)}:`,
        mode,
        markerScope: 'message',
        virtualShards: SHARDS,
      });
    });

    it('never misses a written digest: 4,000 messages in batches of 500, every one a duplicate when it comes again', async () => {
      const batches = Array.from({ length: 8 }, (_, b) => messages('seen', b * 10_000, 500));
      for (const batch of batches)
        expect(
          [...(await run(batch)).marked].every((flag) => flag === 0),
          'new the first time',
        ).to.equal(true);
      for (const batch of batches) {
        const again = await run({ ...batch, batchId: randomUUID() });
        expect(
          [...again.marked].filter((flag) => flag !== 1),
          'a redelivery the filter let through as new',
        ).to.deep.equal([]);
      }
    });

    it('reads the marker hashes only for the digests the filter may hold: new messages cost no HMGET', async () => {
      for (let b = 0; b < 6; b++) await run(messages('fill', b * 10_000, 500));
      const before = await calls(admin, 'hmget');
      const fresh = await run(messages('fresh', 0, 500));
      const hmgets = (await calls(admin, 'hmget')) - before;
      expect([...fresh.marked].every((flag) => flag === 0)).to.equal(true);
      // Without the filter: one HMGET per message (each lands in a hash of its own). The filter's false "may hold" is well under 5 %.
      expect(hmgets, 'HMGETs for 500 new messages').to.be.at.most(25);
      const redelivered = messages('fill', 0, 500);
      const beforeAgain = await calls(admin, 'hmget');
      expect([...(await run({ ...redelivered, batchId: randomUUID() })).marked].every((flag) => flag === 1)).to.equal(true);
      expect((await calls(admin, 'hmget')) - beforeAgain, 'duplicates are looked up').to.be.greaterThan(100);
    });

    it("sets each written digest's bits where the shared arithmetic (filterSlotOf) says, and no other: tools and scripts agree", async () => {
      const batch = messages('slots', 0, 200);
      await run(batch);
      const [filterKey] = await admin.keys(`${settings.prefix}mk:*:f`);
      const meta = filterKey!.replace(/:f$/, ':m');
      const blocks = Number(await admin.hget(meta, 'f'));
      // A first bucket (none before it) expects its initial sub-buckets' worth of markers at 64 each.
      expect(blocks).to.equal(filterBlocksFor(settings.markerSubBuckets * 64, markerFilterBits('message')));
      const filter = (await admin.getBuffer(filterKey!))!;
      for (const id of batch.ids) {
        const { block, bits } = filterSlotOf(markerDigest(id), blocks);
        expect((filter.readUInt32BE(block * 4) & bits) >>> 0, id).to.equal(bits);
      }
      // Exactly those bits, no more: a subset check alone passes when filterSlotOf names fewer bits than the script sets
      // (a tool laying filters out with it would then leave written digests reading as new). filter-arithmetic.test.ts
      // compares the two on random digests.
      const expected = Buffer.alloc(blocks * 4);
      for (const id of batch.ids) {
        const { block, bits } = filterSlotOf(markerDigest(id), blocks);
        expected.writeUInt32BE((expected.readUInt32BE(block * 4) | bits) >>> 0, block * 4);
      }
      expect(filter.equals(expected), 'the filter holds exactly the bits filterSlotOf names').to.equal(true);
    });

    it('sizes a filtered bucket for large hashes (the filter spares the lookups) and its filter for the bucket before', async function () {
      // 2 s buckets: wait for the start of one, fill it, then write into the next.
      settings = { ...settings, markerTtlS: 4, markerBucketS: 2 };
      const width = settings.markerBucketS;
      const nowS = async () => Number((await admin.time())[0]);
      while ((await nowS()) % width !== 0) await new Promise((resolve) => setTimeout(resolve, 50));
      const first = Math.floor((await nowS()) / width);
      for (let b = 0; b < 6; b++) await run(messages('size', b * 10_000, 500));
      expect(Math.floor((await nowS()) / width), 'the fill stayed in one bucket').to.equal(first);
      const written = Number(await admin.hget(markerMetaKey(settings.prefix, SHARD, first), 'n'));
      expect(written).to.equal(3_000);
      while (Math.floor((await nowS()) / width) === first) await new Promise((resolve) => setTimeout(resolve, 50));
      await run(messages('size-next', 0, 10));
      const next = markerMetaKey(settings.prefix, SHARD, first + 1);
      const subs = Number(await admin.hget(next, 's'));
      expect(subs, 'sized at 16,384 markers per hash: one hash for 3,000').to.equal(subBucketsAfter(3_000, settings.markerSubBuckets, markersPerSubBucket(12)));
      expect(subs, 'not at 64 per hash').to.be.below(subBucketsAfter(3_000, settings.markerSubBuckets));
      expect(Number(await admin.hget(next, 'f'))).to.equal(filterBlocksFor(3_000, markerFilterBits('message')));
    });

    it('reads every hash of a bucket whose filter key is gone (deleted by hand): still no duplicate counted twice', async () => {
      const batch = messages('lost', 0, 300);
      await run(batch);
      const filters = await admin.keys(`${settings.prefix}mk:*:f`);
      expect(filters.length, 'the bucket has a filter').to.be.at.least(1);
      await admin.del(...filters);
      expect([...(await run({ ...batch, batchId: randomUUID() })).marked].every((flag) => flag === 1)).to.equal(true);
    });
  });
}
