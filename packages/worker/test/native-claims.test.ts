/**
 * Native claims (native-claims.ts, claim-parts.ts) on a private Redis: new
 * parts claimed by the pipeline, everything else decided by the claim
 * script, every part counted once, whoever claims it and however the claims
 * interleave. 20 s buckets and a 40 s marker TTL, so a test waits at most one
 * bucket for the window in which claims are trusted.
 */
import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import type { Redis } from 'ioredis';
import {
  filterSlotOf,
  markerDigest,
  markerMetaKey,
  markerBucketKey,
  markerShardOf,
  subBucketOf,
  PART_DONE,
  PART_HELD,
  PART_NEW,
  type BatchResult,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { readMarkers, startPrivateRedis, testWorkerSettings, type PrivateRedis } from '@tally/testkit';
import type { BatchLog } from '../src/batch-log.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';
import { EXPIRY_MEMORY_MS } from '../src/native-claims.js';

const quiet: BatchLog = { warn() {}, error() {} };
const SHARDS = 16;
const SHARD = 1;
const WIDTH_S = 20;
const TTL_S = 40;

/** `count` whole messages of marker shard SHARD, one change each (SKU `S<n % 40>`), ids from `from` on. */
function messages(label: string, from: number, count: number): BatchTask & { ids: string[] } {
  const ids: string[] = [];
  for (let n = from; ids.length < count; n++) {
    const id = `${label}-${n}`;
    if (markerShardOf(markerDigest(id), SHARDS) === SHARD) ids.push(id);
  }
  return { vshard: SHARD, batchId: randomUUID(), ids, changes: ids.map((_, i) => [[`S${i % 40}`, 1]]) };
}

const newParts = (result: BatchResult): number => result.marked.filter((flag) => flag === PART_NEW).length;

async function serverSeconds(redis: Redis): Promise<number> {
  const [s, us] = await redis.time();
  return Number(s) + Number(us) / 1e6;
}

/** Waits until the server's clock is between `from` and `to` seconds into a bucket. */
async function waitForPhase(redis: Redis, from: number, to: number): Promise<void> {
  for (;;) {
    const phase = (await serverSeconds(redis)) % WIDTH_S;
    if (phase >= from && phase < to) return;
    await new Promise((resolve) => setTimeout(resolve, phase < from ? (from - phase) * 1000 : (WIDTH_S - phase + from) * 1000));
  }
}

/** The sum of every count key of the prefix: one per counted message, each message carrying one change of 1. */
async function countedTotal(redis: Redis, prefix: string): Promise<number> {
  const keys = await redis.keys(`${prefix}c:*`);
  let total = 0;
  for (const key of keys) total += Number(await redis.get(key));
  return total;
}

/**
 * Stages what a claim pipeline left when it never got to occupy: its record
 * `b<id>` (daemon `token`, made now) and its id as the marker of each of
 * `ids`, in the bucket of now. Returns that bucket.
 */
async function stagePipelineClaim(redis: Redis, prefix: string, ids: readonly string[], token: string, id: string): Promise<number> {
  const [seconds] = await redis.time();
  const bucket = Math.floor(Number(seconds) / WIDTH_S);
  const meta = markerMetaKey(prefix, SHARD, bucket);
  await redis.hset(meta, `b${id}`, `c${token}:${Number(seconds) * 1000}`);
  const subs = Number(await redis.hget(meta, 's'));
  for (const message of ids) {
    const digest = markerDigest(message);
    await redis.hset(markerBucketKey(prefix, SHARD, bucket, subBucketOf(digest, subs)), digest, id);
  }
  return bucket;
}

/** Stages a done marker for `id` in the bucket before the server's now, with its filter (64 blocks) and its meta, as a claim there leaves it. */
async function stageSettledMarker(redis: Redis, prefix: string, id: string, markers = 1): Promise<void> {
  const [seconds] = await redis.time();
  const before = Math.floor(Number(seconds) / WIDTH_S) - 1;
  const digest = markerDigest(id);
  const meta = markerMetaKey(prefix, SHARD, before);
  const hash = markerBucketKey(prefix, SHARD, before, 0);
  const filterKey = `${prefix}mk:{${SHARD}}:${before}:f`;
  await redis.hset(meta, 's', 1, 'f', 64, 'n', markers);
  await redis.hset(hash, digest, '1');
  const { block, bits } = filterSlotOf(digest, 64);
  const filter = Buffer.alloc(64 * 4);
  filter.writeUInt32BE(bits, block * 4);
  await redis.set(filterKey, filter);
  for (const key of [meta, hash, filterKey]) await redis.expireat(key, (before + 1) * WIDTH_S + TTL_S);
}

describe('native claims (two-step, message-scoped markers, a private Redis)', function () {
  this.timeout(120_000);
  let server: PrivateRedis;
  let admin: Redis;
  let client: Redis;
  let other: Redis;
  let settings: WorkerSettings;
  const run = (task: BatchTask, overrides: Partial<WorkerSettings> = {}, redis: Redis = client): Promise<BatchResult> =>
    runTwoStepBatch(redis, { ...settings, ...overrides }, task, quiet);
  /** A first batch through the script, so the thread learns the bucket's shape and copies the older buckets. */
  const warmUp = async (): Promise<void> => {
    await run(messages('warm', 0, 5));
    await new Promise((resolve) => setTimeout(resolve, 200));
  };

  before(async () => {
    server = await startPrivateRedis();
    admin = server.admin();
    client = createRedisClient(server.url, 'test-native-claims');
    other = createRedisClient(server.url, 'test-native-claims-other');
  });
  after(async () => {
    admin.disconnect();
    client.disconnect();
    other.disconnect();
    await server.stop();
  });
  beforeEach(async () => {
    settings = testWorkerSettings({
      redisUrl: server.url,
      prefix: `t.native.${randomUUID().slice(0, 8)}:`,
      markerScope: 'message',
      virtualShards: SHARDS,
      markerTtlS: TTL_S,
      markerBucketS: WIDTH_S,
      nativeClaims: true,
    });
    await waitForPhase(admin, 8, 15);
  });

  it('claims new parts by the pipeline, and a redelivery of them is found done (by the script)', async () => {
    await warmUp();
    const first = messages('first', 0, 300);
    const claimed = await run(first);
    expect(claimed.nativeClaims, 'parts the pipeline claimed').to.equal(300);
    expect(newParts(claimed)).to.equal(300);
    // The markers hold the pipeline's claim id; its record turned done at the occupation.
    const snapshot = await readMarkers(admin, settings.prefix);
    expect(snapshot.claims.size, 'claims left').to.equal(0);
    expect(snapshot.done.size).to.equal(305);

    const again = await run({ ...messages('first', 0, 300), batchId: randomUUID() });
    expect(
      [...again.marked].every((flag) => flag === PART_DONE),
      'a redelivery counted again',
    ).to.equal(true);
    const mixed = await run({
      ...first,
      ids: [...first.ids.slice(0, 50), ...messages('more', 0, 50).ids],
      batchId: randomUUID(),
      changes: Array.from({ length: 100 }, () => [['S0', 1]]),
    });
    expect(mixed.marked.slice(0, 50).every((flag) => flag === PART_DONE)).to.equal(true);
    expect(mixed.marked.slice(50).every((flag) => flag === PART_NEW)).to.equal(true);
    expect(mixed.nativeClaims, 'the new half by the pipeline').to.equal(50);
    expect(await countedTotal(admin, settings.prefix)).to.equal(355);
  });

  it('is off unless asked for (TALLY_MARKER_NATIVE_CLAIMS): every claim by the script', async () => {
    await warmUp();
    const result = await run(messages('default', 0, 100), { nativeClaims: undefined });
    expect(newParts(result)).to.equal(100);
    expect(result.nativeClaims).to.equal(0);
  });

  it('sets the filter bits of what it claims, so the claim script finds the claims', async () => {
    await warmUp();
    const batch = messages('bits', 0, 200);
    expect((await run(batch)).nativeClaims).to.equal(200);
    const [filterKey] = await admin.keys(`${settings.prefix}mk:*:f`);
    const blocks = Number(await admin.hget(filterKey!.replace(/:f$/, ':m'), 'f'));
    const filter = (await admin.getBuffer(filterKey!))!;
    for (const id of batch.ids) {
      const { block, bits } = filterSlotOf(markerDigest(id), blocks);
      expect((filter.readUInt32BE(block * 4) & bits) >>> 0, id).to.equal(bits);
    }
    // An old build (the script for every claim) finds every one of them done.
    const old = await run({ ...batch, batchId: randomUUID() }, { nativeClaims: false });
    expect([...old.marked].every((flag) => flag === PART_DONE)).to.equal(true);
  });

  it("leaves a part another daemon holds a live claim on, and counts it once that daemon's claim is done", async () => {
    await warmUp();
    const batch = messages('held', 0, 100);
    // Another daemon's pipeline claim on 40 of them, never occupied: it was killed after its pre-check.
    const bucket = await stagePipelineClaim(admin, settings.prefix, batch.ids.slice(0, 40), 'b2', 'nkilled');
    const meta = markerMetaKey(settings.prefix, SHARD, bucket);
    const result = await run(batch);
    expect(
      result.marked.slice(0, 40).every((flag) => flag === PART_HELD),
      'held by the live claim',
    ).to.equal(true);
    expect(result.marked.slice(40).every((flag) => flag === PART_NEW)).to.equal(true);
    expect(result.nativeClaims).to.equal(60);
    // The claim runs out (record gone: no claim), and the held ones are counted by the next run.
    await admin.hdel(meta, 'bnkilled');
    const later = await run({ ...batch, batchId: randomUUID() });
    expect(later.marked.slice(0, 40).every((flag) => flag === PART_NEW)).to.equal(true);
    expect(later.marked.slice(40).every((flag) => flag === PART_DONE)).to.equal(true);
    expect(await countedTotal(admin, settings.prefix)).to.equal(105);
  });

  it('sends a digest a settled bucket may hold to the script: a duplicate from the bucket before is found', async () => {
    // Stage a done marker in the bucket before, with its filter, as a claim there would have left it.
    const old = messages('old', 0, 1);
    await stageSettledMarker(admin, settings.prefix, old.ids[0]!);
    await warmUp();
    const fresh = messages('fresh', 0, 99);
    const result = await run({ ...fresh, ids: [old.ids[0]!, ...fresh.ids], changes: [[['S0', 1]], ...fresh.changes] });
    expect(result.marked[0], 'the duplicate from the bucket before').to.equal(PART_DONE);
    expect(result.marked.slice(1).every((flag) => flag === PART_NEW)).to.equal(true);
    expect(result.nativeClaims).to.equal(99);
  });

  it('counts each part once when daemons race for the same messages: pipeline against pipeline, and against the script', async () => {
    await warmUp();
    let counted = 0;
    for (const [label, otherSettings] of [
      ['pipelines', { claimToken: 'b2' }],
      ['an old build', { claimToken: 'b2', nativeClaims: false }],
    ] as const) {
      let native = 0;
      for (let round = 0; round < 20; round++) {
        const batch = messages(`race-${label}-${round}`, 0, 100);
        const [a, b] = await Promise.all([run(batch), run({ ...batch, batchId: randomUUID() }, otherSettings, other)]);
        native += a.nativeClaims! + b.nativeClaims!;
        for (let i = 0; i < 100; i++) {
          // One counts it; the other holds it (a live claim) or finds it done.
          const news = (a.marked[i] === PART_NEW ? 1 : 0) + (b.marked[i] === PART_NEW ? 1 : 0);
          expect(news, `${label}, round ${round}, part ${i}: counted by ${news} daemons`).to.equal(1);
        }
        counted += 100;
      }
      expect(native, `${label}: the pipelines claimed some of them`).to.be.greaterThan(0);
    }
    expect(await countedTotal(admin, settings.prefix)).to.equal(5 + counted);
    const snapshot = await readMarkers(admin, settings.prefix);
    expect(snapshot.done.size).to.equal(5 + counted);
    expect(snapshot.claims.size).to.equal(0);
  });

  it("does not trust claims whose time is off the server's clock: other daemons judge a claim's age by it", async () => {
    await warmUp();
    const batch = messages('skewed', 0, 100);
    // 2 s ahead: still inside the bucket's window, but the record would make the claims look 2 s younger than they are.
    const result = await run(batch, { nativeClaimSkewMs: 2_000 });
    expect(newParts(result)).to.equal(100);
    expect(result.nativeClaims, 'claims trusted with a time 2 s off').to.equal(0);
    expect((await readMarkers(admin, settings.prefix)).claims.size).to.equal(0);
    expect((await run(messages('unskewed', 0, 100))).nativeClaims, 'the clock right again').to.equal(100);
  });

  it('reads a settled filter again once its bucket took markers after the copy, instead of refusing every batch after', async () => {
    await warmUp();
    // A write into the bucket before, after this thread copied it (empty): a clock set back, a late pipeline.
    await stageSettledMarker(admin, settings.prefix, messages('late-write', 0, 1).ids[0]!);
    const refused = await run(messages('after-write', 0, 50));
    expect(refused.nativeClaims, 'the moved count is caught').to.equal(0);
    await new Promise((resolve) => setTimeout(resolve, 200));
    const next = await run(messages('after-reread', 0, 50));
    expect(next.nativeClaims, 'claimed natively again once the copy is read again').to.equal(50);
    expect(newParts(next)).to.equal(50);
  });

  it('leaves a lost filter lost: a bucket whose filter key is gone is read in full, never trusted with only new bits', async () => {
    await warmUp();
    const [filterKey] = await admin.keys(`${settings.prefix}mk:*:f`);
    await admin.del(filterKey!);
    const batch = messages('no-filter', 0, 100);
    const result = await run(batch);
    expect(result.nativeClaims, 'claims trusted into a bucket without its filter').to.equal(0);
    expect(newParts(result)).to.equal(100);
    expect(await admin.exists(filterKey!), 'the filter brought back with only these bits').to.equal(0);
    const again = await run({ ...batch, batchId: randomUUID() });
    expect([...again.marked].every((flag) => flag === PART_DONE)).to.equal(true);
  });

  it('a lost reply: parts this daemon claimed by a pipeline whose reply never came are its own, and counted once', async () => {
    await warmUp();
    // What a pipeline whose reply never came left: its record and claims, under this daemon's token.
    const claimOnly = messages('claimed', 0, 100);
    await stagePipelineClaim(admin, settings.prefix, claimOnly.ids, settings.claimToken, 'nmine');
    const retried = await run(claimOnly);
    expect(newParts(retried), 'its own claims are taken again').to.equal(100);
    expect(retried.nativeClaims, 'by the script: the fields were there').to.equal(0);
    expect((await readMarkers(admin, settings.prefix)).claims.size).to.equal(0);
    expect(await countedTotal(admin, settings.prefix)).to.equal(105);
  });

  it("sets a hash's expiry once, not per batch: a later batch into the same hashes sends no EXPIREAT, and a hash recreated later gets it again", async () => {
    await warmUp();
    const expireats = async (): Promise<number> => Number(/cmdstat_expireat:calls=(\d+)/.exec(await admin.info('commandstats'))?.[1] ?? 0);
    const [seconds] = await admin.time();
    const bucket = Math.floor(Number(seconds) / WIDTH_S);
    const subs = Number(await admin.hget(markerMetaKey(settings.prefix, SHARD, bucket), 's'));
    const subsOf = (task: { ids: string[] }): Set<number> => new Set(task.ids.map((id) => subBucketOf(markerDigest(id), subs)));
    const first = messages('expiry', 0, 200);
    const second = messages('expiry', 1_000, 200);
    const before = await expireats();
    expect((await run(first)).nativeClaims).to.equal(200);
    const afterFirst = await expireats();
    expect(afterFirst - before, 'an EXPIREAT per hash the first batch wrote').to.equal(subsOf(first).size);
    expect((await run(second)).nativeClaims).to.equal(200);
    const firstSubs = subsOf(first);
    const newSubs = [...subsOf(second)].filter((sub) => !firstSubs.has(sub)).length;
    expect((await expireats()) - afterFirst, 'an EXPIREAT only for the hashes the first batch did not write').to.equal(newSubs);
    const hashes = await admin.keys(`${settings.prefix}mk:{${SHARD}}:${bucket}:*`);
    expect(firstSubs.size, 'the batches spread over several hashes').to.be.greaterThan(1);
    for (const key of hashes) expect(await admin.ttl(key), `${key} expires`).to.be.greaterThan(0);

    // A hash that vanishes while the bucket lives (an occupation that deleted its only fields, a failover) and is
    // recreated by a later batch's HSETNX gets its expiry again once the thread's memory of it has run out.
    const third = messages('expiry', 2_000, 200);
    const gone = markerBucketKey(settings.prefix, SHARD, bucket, subBucketOf(markerDigest(third.ids[0]!), subs));
    await admin.del(gone);
    await new Promise((resolve) => setTimeout(resolve, EXPIRY_MEMORY_MS + 100));
    expect((await run(third)).nativeClaims).to.equal(200);
    expect(await admin.ttl(gone), 'the recreated hash expires').to.be.greaterThan(0);
  });

  it("gives a hash of an older bucket that has no expiry its bucket's (a pipeline cut between HSETNX and EXPIREAT), and leaves other expiries alone", async () => {
    // What a SIGKILL between a pipeline's HSETNX and its EXPIREAT leaves in the bucket before: a hash without expiry.
    await stageSettledMarker(admin, settings.prefix, 'settled-0');
    const [seconds] = await admin.time();
    const before = Math.floor(Number(seconds) / WIDTH_S) - 1;
    const stranded = markerBucketKey(settings.prefix, SHARD, before, 0);
    await admin.persist(stranded);
    // And a filter left without one (recreated by a pipeline's BITFIELD after it was lost, then cut).
    const filterKey = `${settings.prefix}mk:{${SHARD}}:${before}:f`;
    await admin.persist(filterKey);
    // A hash that has an expiry of its own keeps it: the sweep only adds one where there is none.
    const other = markerBucketKey(settings.prefix, SHARD, before, 1);
    await admin.hset(other, 'x', '1');
    await admin.expire(other, 1_000);
    await admin.hset(markerMetaKey(settings.prefix, SHARD, before), 's', 2);
    expect(await admin.ttl(stranded)).to.equal(-1);
    // This thread's first batch of the shard (as after a restart) sweeps every older live bucket, in the background.
    await run(messages('sweep', 0, 20));
    for (let i = 0; i < 50 && (await admin.ttl(stranded)) === -1; i++) await new Promise((resolve) => setTimeout(resolve, 20));
    const expiresAtS = (before + 1) * WIDTH_S + TTL_S;
    const [now] = await admin.time();
    expect(await admin.ttl(stranded), 'the stranded hash expires with its bucket').to.be.closeTo(expiresAtS - Number(now), 1);
    expect(await admin.ttl(filterKey), 'the filter expires with its bucket').to.be.closeTo(expiresAtS - Number(now), 1);
    expect(await admin.ttl(other), 'an expiry already set').to.be.greaterThan(900);
  });

  // Last: it waits for the start of a bucket, after which the next test would wait for the window again.
  it("throws the pipeline's claims away when the server's clock left its bucket: the script decides, and nothing is left claimed", async () => {
    await warmUp();
    // Just past the boundary, with the thread's clock estimate held 5 s back: it plans for the bucket that just ended.
    await waitForPhase(admin, 0.2, 1.5);
    const batch = messages('late', 0, 100);
    const result = await run(batch, { nativeClaimSkewMs: -5_000 });
    expect(newParts(result)).to.equal(100);
    expect(result.nativeClaims, 'no claim of the pipeline was trusted').to.equal(0);
    const snapshot = await readMarkers(admin, settings.prefix);
    expect(snapshot.claims.size, 'claims left behind').to.equal(0);
    expect(snapshot.done.size).to.equal(105);
    // The pipeline did write into the bucket that ended; its record is gone, so those claims read as no claim.
    const [seconds] = await admin.time();
    const ended = Math.floor(Number(seconds) / WIDTH_S) - 1;
    const records = Object.keys(await admin.hgetall(markerMetaKey(settings.prefix, SHARD, ended))).filter((field) => field.startsWith('bn'));
    expect(records, 'records of the pipeline in the bucket that ended').to.deep.equal([]);
    expect(await countedTotal(admin, settings.prefix)).to.equal(105);
  });
});
