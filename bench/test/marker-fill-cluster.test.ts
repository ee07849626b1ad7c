/**
 * The steady-state fills on a private Redis Cluster (`--scale-out
 * --steady-state`): every shard's buckets land whole on the master of its
 * slot, whichever master that is (the fill script is loaded on each; a
 * script loaded on one answers NOSCRIPT on the others); and the hand-written
 * reference's population and its cluster-aware consumer, which must count
 * exactly there to be a reference at all.
 */
import amqp from 'amqplib';
import { expect } from 'chai';
import { Cluster } from 'ioredis';
import { countKey, filterBitsOfFormat, markerBucketKey, markerFormatOf, markerMetaKey, parseInfo, shardOf } from '@tally/shared';
import { startRedisCluster, type RedisCluster } from '@tally/testkit';
import { fillBatchedMarkers } from '../src/batched-fill.js';
import { deleteBenchQueues } from '../src/broker.js';
import { startContender } from '../src/contenders.js';
import { fillMarkers, serverNowS, writeLayout } from '../src/marker-fill.js';
import { evenShares, steadyPopulation } from '../src/steady-population.js';

const AMQP_URL = process.env.TALLY_AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';

/** Keys per master (INFO keyspace, db0). */
async function keysPerMaster(client: Cluster): Promise<number[]> {
  return Promise.all(client.nodes('master').map(async (node) => Number(/keys=(\d+)/.exec(parseInfo(await node.info('keyspace')).get('db0') ?? '')?.[1] ?? 0)));
}

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
    const perMaster = await keysPerMaster(client);
    expect(perMaster).to.have.length(3);
    for (const keys of perMaster) expect(keys).to.be.above(0);
  });

  it("fills the hand-written reference's markers under its hash tags, and its consumer counts exactly beside them", async () => {
    await Promise.all(client.nodes('master').map((node) => node.flushall()));
    const prefix = 'cbatched:';
    const fill = await fillBatchedMarkers(client, prefix, 10, 60);
    expect(fill.markers).to.equal(600);
    const filled: string[] = [];
    for (const node of client.nodes('master')) {
      let cursor = '0';
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}m:*`, 'COUNT', 1000);
        cursor = next;
        filled.push(...keys);
      } while (cursor !== '0');
    }
    expect(filled, 'every marker written once').to.have.length(600);
    const tags = new Set(filled.map((key) => /^cbatched:m:\{m(\d+)\}:fill-\d+$/.exec(key)?.[1]));
    expect([...tags].sort(), 'the 16 tags of the consumer, nothing untagged').to.deep.equal([...Array(16).keys()].map(String).sort());
    const ttls = await Promise.all(filled.slice(0, 50).map((key) => client.ttl(key)));
    // Counted from the planned end of the fill, which it waited for: 1 s to the TTL left (TTL rounds to the second).
    for (const ttl of ttls) expect(ttl).to.be.within(1, 61);
    expect(new Set(ttls).size, 'TTLs spread, so the markers expire during a drain').to.be.above(10);

    // 300 messages and 30 redeliveries of some of them, through the consumer the scale-out figures run on a cluster.
    const queue = `bench.test.cbatched.${process.pid}`;
    await deleteBenchQueues(AMQP_URL, queue);
    const connection = await amqp.connect(AMQP_URL);
    const truth = new Map<string, number>();
    try {
      const channel = await connection.createConfirmChannel();
      await channel.assertQueue(queue, { durable: true });
      for (let i = 0; i < 330; i++) {
        const n = i < 300 ? i : (i - 300) * 7;
        const changes = [{ sku: `sku-${n % 13}`, delta: 1 + (n % 3) }];
        if (i < 300) for (const { sku, delta } of changes) truth.set(sku, (truth.get(sku) ?? 0) + delta);
        channel.sendToQueue(queue, Buffer.from(JSON.stringify({ id: `msg-${n}`, changes })), { persistent: true });
      }
      await channel.waitForConfirms();
    } finally {
      await connection.close();
    }
    const consumer = await startContender({
      contender: 'batched',
      queue,
      prefix,
      amqpUrl: AMQP_URL,
      redisUrl: cluster.seedUrls.join(','),
      prefetch: 1_000,
      ackEvery: 100,
      ackWaitMs: 20,
      expected: 330,
      recordLatency: false,
    });
    try {
      const done = await consumer.done;
      expect(done.duplicates, 'every redelivery caught across the tags').to.equal(30);
    } finally {
      await consumer.stop();
      await deleteBenchQueues(AMQP_URL, queue);
    }
    for (const [sku, count] of truth) expect(await client.get(countKey(prefix, shardOf(sku, 16), sku)), sku).to.equal(String(count));
    const tagged = await Promise.all([...Array(16).keys()].map((tag) => client.exists(`${prefix}m:{m${tag}}:msg-0`)));
    expect(
      tagged.reduce((a, b) => a + b, 0),
      "a message's marker under exactly one tag",
    ).to.equal(1);
    const perMaster = await keysPerMaster(client);
    expect(
      perMaster.reduce((a, b) => a + b, 0),
      'fill + 300 markers + 13 counts',
    ).to.equal(600 + 300 + 13);
  });
});
