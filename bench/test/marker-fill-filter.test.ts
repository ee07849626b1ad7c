/**
 * The steady-state fill of a prefix with message-scoped markers: every
 * bucket gets its filter as the daemon's scripts make it (meta `f`, the
 * `:f` key with the bucket's expiry), and every filled digest's bits are set
 * in it, so the daemon's pre-check meets the filled population as it would
 * meet its own (a digest missing from the filter would read as new), and
 * the filter is as full as a workload's digests would make it (a sparser
 * one would spare the pre-check the false "may hold" of a natural run).
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

  it('fills each filter as densely as random digests would', async () => {
    // One shard, 90,000 markers in a full bucket: 8 hashes of the 16,384 a filtered bucket is sized for.
    const population = steadyPopulation({
      rate: 300,
      markerTtlS: 600,
      bucketWidthS: 300,
      partsPerMessageByShard: [1],
      nowS: await serverNowS(redis),
      markersPerHash: markersPerSubBucket(12),
    });
    const dense = 'filld:';
    await writeLayout(redis, { prefix: dense, virtualShards: 16, mode: 'two-step', bucketS: 300, subBuckets: 256, format: MESSAGE_MARKER_FORMAT });
    const bits = markerFilterBits('message');
    await fillMarkers(redis, { prefix: dense, population, seed: 5, filterBits: bits });
    const full = population.buckets.filter((b) => b.markers === population.buckets[0]!.markers);
    expect(full.length, 'full buckets to measure').to.be.greaterThan(0);
    for (const b of full) {
      expect(b.subBuckets, 'several hashes per bucket').to.be.greaterThanOrEqual(4);
      const blocks = filterBlocksFor(b.sizedFor, bits);
      const filter = (await redis.getBuffer(`${dense}mk:{${b.vshard}}:${b.bucket}:f`))!;
      let set = 0;
      for (let i = 0; i < blocks; i++) {
        let word = filter.readUInt32BE(i * 4);
        while (word !== 0) {
          word &= word - 1;
          set++;
        }
      }
      // Each digest sets 4 bits drawn uniformly in a block drawn uniformly: a block holding k digests has a given bit clear
      // with probability (31/32)^(4k), and k is Poisson(markers / blocks).
      const perBlock = b.markers / blocks;
      const expected = 1 - Math.exp(perBlock * ((31 / 32) ** 4 - 1));
      const measured = set / (blocks * 32);
      expect(measured, `set bits of the filter of a bucket of ${b.markers} markers in ${blocks} blocks`).to.be.closeTo(expected, expected * 0.05);
    }
  });
});
