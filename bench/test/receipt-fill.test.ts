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

  it('counts one receipt per count batch: a lane closes at the batch size or the batch wait, and never holds less than a part', () => {
    // 700 parts/s on each of 16 lanes: a batch every 50 ms (35 parts), 20 a second each.
    expect(receiptsPerSecond(3_000, new Array(16).fill(700 / 3_000), 500, 50)).to.equal(320);
    // 10 parts/s: each part its own batch.
    expect(receiptsPerSecond(10, [1], 500, 50)).to.equal(10);
    // 40,000 parts/s: full batches of 500 close before the wait.
    expect(receiptsPerSecond(40_000, [1], 500, 50)).to.equal(80);
    expect(receiptsPerSecond(3_000, [0, 0], 500, 50)).to.equal(0);
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

    it("writes each shard's share as receipts of the marker TTL, spread over it", async () => {
      const prefix = 'rf:';
      const written = await fillReceipts(redis, { prefix, rate: 100, countShares: [2, 0, 0.5], batchSize: 500, batchWaitMs: 50, markerTtlS: 600 });
      // Shard 0: 200 parts/s, 20 batches/s; shard 2: 50 parts/s, 20 batches/s; shard 1: none.
      expect(written).to.equal(2 * 20 * 600);
      for (const [vshard, expected] of [
        [0, 12_000],
        [1, 0],
        [2, 12_000],
      ] as const) {
        const keys: string[] = [];
        let cursor = '0';
        do {
          const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}w:{${vshard}}:*`, 'COUNT', 5000);
          cursor = next;
          keys.push(...found);
        } while (cursor !== '0');
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
  });
});
