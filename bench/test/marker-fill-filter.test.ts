/**
 * The steady-state fill of a prefix with message-scoped markers: every
 * bucket gets its filter as the daemon's scripts make it (meta `f`, the
 * `:f` key with the bucket's expiry), and every filled digest's bits are set
 * in it, so the daemon's pre-check meets the filled population as it would
 * meet its own (a digest missing from the filter would read as new).
 */
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { filterBlocksFor, filterSlotOf, markerBucketKey, markerFilterBits, markerMetaKey, markersPerSubBucket, MESSAGE_MARKER_FORMAT } from '@tally/shared';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import { fillMarkers, serverNowS, writeLayout } from '../src/marker-fill.js';
import { steadyPopulation } from '../src/steady-population.js';

describe('steady-state marker fill with filters (message-scoped markers, private redis-server)', function () {
  this.timeout(60_000);
  let server: PrivateRedis;
  let redis: Redis;
  const prefix = 'fillf:';

  before(async () => {
    server = await startPrivateRedis();
    redis = new Redis(server.url);
  });
  after(async () => {
    redis?.disconnect();
    await server?.stop();
  });

  it("sets every filled digest's bits in its bucket's filter, sized and expiring as openBucket makes it", async () => {
    const population = steadyPopulation({
      rate: 4,
      markerTtlS: 600,
      bucketWidthS: 300,
      partsPerMessageByShard: [0.5, 0.5],
      nowS: await serverNowS(redis),
      markersPerHash: markersPerSubBucket(12),
    });
    await writeLayout(redis, { prefix, virtualShards: 16, mode: 'atomic', bucketS: 300, subBuckets: 256, format: MESSAGE_MARKER_FORMAT });
    const bits = markerFilterBits('message');
    await fillMarkers(redis, { prefix, population, seed: 3, filterBits: bits });
    let checked = 0;
    for (const b of population.buckets) {
      const meta = markerMetaKey(prefix, b.vshard, b.bucket);
      const blocks = filterBlocksFor(b.sizedFor, bits);
      expect(await redis.hget(meta, 'f')).to.equal(String(blocks));
      const filterKey = `${prefix}mk:{${b.vshard}}:${b.bucket}:f`;
      expect(await redis.strlen(filterKey), 'sized as openBucket sizes it').to.equal(blocks * 4);
      expect(await redis.call('EXPIRETIME', filterKey)).to.equal(b.expiresAt);
      const filter = (await redis.getBuffer(filterKey))!;
      for (let sub = 0; sub < b.subBuckets; sub++) {
        const flat = (await redis.callBuffer('HGETALL', markerBucketKey(prefix, b.vshard, b.bucket, sub))) as Buffer[];
        for (let i = 0; i < flat.length; i += 2) {
          const { block, bits: wanted } = filterSlotOf(flat[i]!, blocks);
          expect((filter.readUInt32BE(block * 4) & wanted) >>> 0, 'its bits are set').to.equal(wanted);
          checked++;
        }
      }
    }
    expect(checked).to.equal(population.totalMarkers);
    expect(checked, 'a population to check').to.be.greaterThan(1_000);
  });
});
