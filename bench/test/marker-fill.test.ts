/**
 * The steady-state fill against a private redis-server: the layout it
 * leaves (keys, fields, meta fields, expiries) and what the daemon's own
 * scripts (the worker's two-step batch) make of it.
 */
import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, markerBucketKey, markerDigest, markerMetaKey, subBucketOf, type BatchTask } from '@tally/shared';
import { startPrivateRedis, testWorkerSettings, type PrivateRedis } from '@tally/testkit';
import { runTwoStepBatch } from '@tally/worker';
import { fillMarkers, serverNowS, writeLayout } from '../src/marker-fill.js';
import { steadyPopulation, type Population } from '../src/steady-population.js';

const quiet = { warn() {}, error() {} };

/** Every key of a shard's bucket: its meta hash and its marker hashes by sub-bucket. */
async function bucketKeys(redis: Redis, prefix: string, vshard: number, bucket: number): Promise<{ meta: Record<string, string>; subs: number[] }> {
  const keys = await redis.keys(`${prefix}mk:{${vshard}}:${bucket}:*`);
  const subs = keys
    .map((key) => key.slice(key.lastIndexOf(':') + 1))
    .filter((sub) => sub !== 'm')
    .map(Number)
    .sort((a, b) => a - b);
  return { meta: await redis.hgetall(markerMetaKey(prefix, vshard, bucket)), subs };
}

/** The meta field x as the sub-buckets whose bit is set. */
async function expiryBits(redis: Redis, meta: string): Promise<number[]> {
  const bitmap = (await redis.hgetBuffer(meta, 'x')) ?? Buffer.alloc(0);
  const subs: number[] = [];
  for (let sub = 0; sub < bitmap.length * 8; sub++) if (bitmap[sub >> 3]! & (1 << (sub & 7))) subs.push(sub);
  return subs;
}

function taskOf(vshard: number, ids: readonly string[]): BatchTask & { ids: readonly string[] } {
  return { vshard, batchId: randomUUID(), ids, changes: ids.map((_, i) => [[`SKU-${vshard}-${i % 3}`, 1]]) };
}

describe('steady-state marker fill (private redis-server)', function () {
  this.timeout(60_000);
  let server: PrivateRedis;
  let redis: Redis;
  const prefix = 'fill:';
  const settings = () => testWorkerSettings({ redisUrl: server.url, prefix, markerTtlS: 600, markerBucketS: 300 });
  let population: Population;

  before(async () => {
    server = await startPrivateRedis();
    redis = new Redis(server.url);
    // The tests read the buckets of now: keep the few seconds they take inside one 300 s bucket.
    const left = 300 - ((await serverNowS(redis)) % 300);
    if (left < 10) await new Promise((resolve) => setTimeout(resolve, (left + 0.5) * 1000));
    // Two shards: 300 and 600 markers per full bucket, so 8 and 16 hashes (64 markers each at most).
    population = steadyPopulation({ rate: 2, markerTtlS: 600, bucketWidthS: 300, partsPerMessageByShard: [0.5, 1], nowS: await serverNowS(redis) });
    await writeLayout(redis, { prefix, virtualShards: 16, mode: 'two-step', bucketS: 300, subBuckets: 256 });
    const report = await fillMarkers(redis, { prefix, population, seed: 1 });
    expect(report.markers).to.equal(population.totalMarkers);
    expect(report.buckets).to.equal(population.buckets.length);
  });

  after(async () => {
    redis?.disconnect();
    await server?.stop();
  });

  it('lays out every live bucket of every shard as the scripts do: s, n, x, 16-byte fields valued 1, expiries', async () => {
    expect(population.buckets).to.have.length(2 * 3);
    let hashes = 0;
    for (const b of population.buckets) {
      const { meta, subs } = await bucketKeys(redis, prefix, b.vshard, b.bucket);
      expect(b.subBuckets).to.equal(b.vshard === 0 ? 8 : 16);
      expect(meta.s).to.equal(String(b.subBuckets));
      expect(meta.n).to.equal(String(b.markers));
      expect(await expiryBits(redis, markerMetaKey(prefix, b.vshard, b.bucket))).to.deep.equal(subs);
      expect(await redis.call('EXPIRETIME', markerMetaKey(prefix, b.vshard, b.bucket))).to.equal(b.expiresAt);
      let fields = 0;
      const seen = new Set<string>();
      for (const sub of subs) {
        const key = markerBucketKey(prefix, b.vshard, b.bucket, sub);
        expect(await redis.call('EXPIRETIME', key)).to.equal(b.expiresAt);
        expect(await redis.object('ENCODING', key)).to.equal('listpack');
        const flat = (await redis.callBuffer('HGETALL', key)) as Buffer[];
        for (let i = 0; i < flat.length; i += 2) {
          const field = flat[i]!;
          expect(field.length).to.equal(16);
          expect(flat[i + 1]!.toString()).to.equal('1');
          // The field is in the hash a digest with these first bytes goes to.
          expect(subBucketOf(field, b.subBuckets)).to.equal(sub);
          seen.add(field.toString('hex'));
          fields++;
        }
      }
      expect(fields).to.equal(b.markers);
      expect(seen.size).to.equal(fields);
      hashes += subs.length;
    }
    expect(hashes).to.be.above(0);
  });

  it('is read by the claim script in every live bucket, and counts a new batch once', async () => {
    const vshard = 1;
    const ids = Array.from({ length: 20 }, (_, i) => `fill-test-${i}`);
    const subs = population.buckets.find((b) => b.vshard === vshard)!.subBuckets;
    const before = (await bucketKeys(redis, prefix, vshard, population.currentBucket)).meta;
    await redis.config('RESETSTAT');
    const first = await runTwoStepBatch(redis, settings(), taskOf(vshard, ids), quiet);
    const stats = await redis.info('commandstats');
    const hmgets = Number(/cmdstat_hmget:calls=(\d+)/.exec(stats)?.[1] ?? 0);
    // One HMGET per hash the digests fall in, in each of the three live buckets.
    const distinct = new Set(ids.map((id) => subBucketOf(markerDigest(id), subs))).size;
    expect(hmgets).to.equal(3 * distinct);
    // Every part new: the filled digests match no message id.
    expect([...first.marked]).to.deep.equal(new Array(ids.length).fill(0));
    const after = (await bucketKeys(redis, prefix, vshard, population.currentBucket)).meta;
    expect(after.s).to.equal(before.s);
    expect(Number(after.n)).to.equal(Number(before.n) + ids.length);
    // A redelivery of the same parts finds them done: counted once.
    const again = await runTwoStepBatch(redis, settings(), taskOf(vshard, ids), quiet);
    expect([...again.marked]).to.deep.equal(new Array(ids.length).fill(1));
    expect(await redis.get(countKey(prefix, vshard, `SKU-${vshard}-0`))).to.equal('7');
  });

  it('sizes a bucket the way openBucket does when the claim script opens it after a filled one', async () => {
    const vshard = 0;
    const current = population.buckets.find((b) => b.vshard === vshard && b.bucket === population.currentBucket)!;
    // Drop the filled current bucket: the script opens it again, from the filled bucket before it.
    const keys = await redis.keys(`${prefix}mk:{${vshard}}:${current.bucket}:*`);
    if (keys.length > 0) await redis.del(...keys);
    const ids = Array.from({ length: 30 }, (_, i) => `fill-open-${i}`);
    await runTwoStepBatch(redis, settings(), taskOf(vshard, ids), quiet);
    const { meta, subs } = await bucketKeys(redis, prefix, vshard, current.bucket);
    expect(meta.s).to.equal(String(current.subBuckets));
    expect(meta.n).to.equal(String(ids.length));
    expect(await expiryBits(redis, markerMetaKey(prefix, vshard, current.bucket))).to.deep.equal(subs);
    expect(await redis.call('EXPIRETIME', markerMetaKey(prefix, vshard, current.bucket))).to.equal(current.expiresAt);
    for (const sub of subs) expect(await redis.call('EXPIRETIME', markerBucketKey(prefix, vshard, current.bucket, sub))).to.equal(current.expiresAt);
  });
});
