/**
 * The steady-state fill on a private Redis Cluster (`--scale-out
 * --steady-state`): every shard's buckets land whole on the master of its
 * slot, whichever master that is (the fill script is loaded on each; a
 * script loaded on one answers NOSCRIPT on the others).
 */
import { expect } from 'chai';
import { Cluster } from 'ioredis';
import { filterBitsOfFormat, markerBucketKey, markerFormatOf, markerMetaKey, parseInfo } from '@tally/shared';
import { startRedisCluster, type RedisCluster } from '@tally/testkit';
import { fillMarkers, serverNowS, writeLayout } from '../src/marker-fill.js';
import { evenShares, steadyPopulation } from '../src/steady-population.js';

describe('steady-state marker fill on a Redis Cluster (private cluster, 3 masters)', function () {
  this.timeout(120_000);
  let cluster: RedisCluster;
  let client: Cluster;

  before(async () => {
    cluster = await startRedisCluster({ replicasPerMaster: 0 });
    client = new Cluster([...cluster.seeds]);
  });

  after(async () => {
    client?.disconnect();
    await cluster?.stop();
  });

  it('fills every shard on whichever master holds it, filters included, as on one server', async () => {
    const prefix = 'cfill:';
    const filterBits = filterBitsOfFormat(markerFormatOf('part'));
    const population = steadyPopulation({
      rate: 4,
      markerTtlS: 600,
      bucketWidthS: 300,
      partsPerMessageByShard: evenShares(4, 16),
      nowS: await serverNowS(client),
    });
    await writeLayout(client, { prefix, virtualShards: 16, mode: 'atomic', bucketS: 300, subBuckets: 256, format: markerFormatOf('part') });
    const report = await fillMarkers(client, { prefix, population, seed: 3, filterBits });
    expect(report.markers).to.equal(population.totalMarkers);
    expect(report.buckets).to.equal(population.buckets.length);

    for (const b of population.buckets) {
      const meta = await client.hgetall(markerMetaKey(prefix, b.vshard, b.bucket));
      expect(meta.n, `shard ${b.vshard} bucket ${b.bucket}`).to.equal(String(b.markers));
      expect(Number(meta.f), 'a filter is recorded').to.be.above(0);
      expect(await client.exists(`${prefix}mk:{${b.vshard}}:${b.bucket}:f`)).to.equal(1);
      let fields = 0;
      for (let sub = 0; sub < b.subBuckets; sub++) fields += await client.hlen(markerBucketKey(prefix, b.vshard, b.bucket, sub));
      expect(fields, `shard ${b.vshard} bucket ${b.bucket}: its markers`).to.equal(b.markers);
    }
    // The 16 shards' hash tags spread over the masters: each holds some of the fill.
    const keysPerMaster = await Promise.all(
      client.nodes('master').map(async (node) => Number(/keys=(\d+)/.exec(parseInfo(await node.info('keyspace')).get('db0') ?? '')?.[1] ?? 0)),
    );
    expect(keysPerMaster).to.have.length(3);
    for (const keys of keysPerMaster) expect(keys).to.be.above(0);
  });
});
