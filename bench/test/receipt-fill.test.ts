/**
 * The write receipts of the steady-state fill (receipt-fill.ts): as many as
 * a steady rate's count batches leave over one marker TTL, per shard, named
 * and expiring as write_counts.lua leaves them, their TTLs spread over the
 * TTL so they expire during the drain.
 */
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { receiptKey } from '@tally/shared';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import { fillReceipts, receiptsPerSecond } from '../src/receipt-fill.js';

describe('steady-state write receipts', function () {
  this.timeout(60_000);

  it('counts one receipt per batch: a lane closes at the batch size or the batch wait, and never holds less than a part', () => {
    const at = (rate: number, laneShares: number[], countShares?: number[]) =>
      receiptsPerSecond({ rate, laneShares, batchSize: 500, batchWaitMs: 50, ...(countShares ? { countShares } : {}) });
    // Message-scoped markers on one Redis at 3,000 msg/s: four lanes of 750 messages/s, a batch every 50 ms each.
    expect(at(3_000, [0.25, 0.25, 0.25, 0.25])).to.equal(80);
    // 10 parts/s: each part its own batch.
    expect(at(10, [1])).to.equal(10);
    // 40,000 parts/s: full batches of 500 close before the wait.
    expect(at(40_000, [1])).to.equal(80);
    expect(at(3_000, [0, 0])).to.equal(0);
    // Counts per slot: a batch of 37.5 messages touches a count shard each holds with probability 1 surely, one with 0 never,
    // and one each message touches with probability 0.1 with probability 1 - 0.9^37.5.
    expect(at(3_000, [0.25, 0.25, 0.25, 0.25], [1, 0, 0.1])).to.be.closeTo(80 * (1 + 1 - 0.9 ** 37.5), 1e-9);
  });

  describe('on a private redis-server', () => {
    let server: PrivateRedis;
    let redis: Redis;
    before(async () => {
      server = await startPrivateRedis();
      redis = new Redis(server.url);
    });
    after(async () => {
      redis?.disconnect();
      await server?.stop();
    });

    /** The receipts under one shard's hash tag (SCAN to the end). */
    async function receiptsOf(prefix: string, vshard: number): Promise<string[]> {
      const keys: string[] = [];
      let cursor = '0';
      do {
        const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}w:{${vshard}}:*`, 'COUNT', 5000);
        cursor = next;
        keys.push(...found);
      } while (cursor !== '0');
      return keys;
    }

    it("writes each lane's receipts of one marker TTL under its shard, spread over the TTL", async () => {
      const prefix = 'rf:';
      const written = await fillReceipts(redis, { prefix, rate: 100, laneShares: [2, 0, 0.5], batchSize: 500, batchWaitMs: 50, markerTtlS: 600 });
      // Lane 0: 200 parts/s, 20 batches/s; lane 2: 50 parts/s, 20 batches/s; lane 1: none.
      expect(written).to.equal(2 * 20 * 600);
      for (const [vshard, expected] of [
        [0, 12_000],
        [1, 0],
        [2, 12_000],
      ] as const) {
        const keys = await receiptsOf(prefix, vshard);
        expect(keys.length, `receipts of shard ${vshard}`).to.equal(expected);
        if (expected === 0) continue;
        expect(keys).to.include(receiptKey(prefix, vshard, 'fill-0'));
        const ttls = await Promise.all(keys.slice(0, 2_000).map((key) => redis.ttl(key)));
        expect(Math.min(...ttls), 'some expire within seconds').to.be.at.most(30);
        expect(Math.max(...ttls), 'some live a whole TTL').to.be.at.least(570);
        expect(ttls.every((t) => t >= 1 && t <= 600)).to.equal(true);
        expect(await redis.get(keys[0]!)).to.equal('1');
      }
    });

    it('puts the receipts of counts written per slot under the count shards, by their shares', async () => {
      const prefix = 'rfc:';
      // One lane of 100 messages/s (20 batches of 5 a second); count shards 0 and 1 in every message: 2 receipts a batch.
      const written = await fillReceipts(redis, {
        prefix,
        rate: 100,
        laneShares: [1],
        countShares: [1, 1, 0],
        batchSize: 500,
        batchWaitMs: 50,
        markerTtlS: 60,
      });
      expect(written).to.equal(2 * 20 * 60);
      for (const [vshard, expected] of [
        [0, 1_200],
        [1, 1_200],
        [2, 0],
      ] as const) {
        expect((await receiptsOf(prefix, vshard)).length, `receipts of count shard ${vshard}`).to.equal(expected);
      }
    });
  });
});
