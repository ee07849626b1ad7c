import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import type { Redis } from 'ioredis';
import { filterSlotOf, markerBaseKey, markerDigest, markerShardOf, type BatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { startPrivateRedis, testWorkerSettings, type PrivateRedis } from '@tally/testkit';
import { runAtomicBatch } from '../src/atomic-batch.js';
import type { BatchLog } from '../src/batch-log.js';
import { evalshaArgs, runScript } from '../src/lua-scripts.js';
import { SettledFilters, settledFiltersOf } from '../src/settled-filters.js';
import { CLAIM_MARKERS, runTwoStepBatch } from '../src/two-step-batch.js';

const quiet: BatchLog = { warn() {}, error() {} };
const SHARDS = 16;
const SHARD = 3;
// 8 s buckets of a 40 s TTL: a bucket settles 8 s after its end (the grace is a bucket's width when that is under
// 60 s) and is live until 40 s after it. Every test's batch is written in one bucket before the tests, which then
// have 32 s in which that settled bucket is still read: one wait for a bucket to settle (about 20 s), not one per test.
const TTL_S = 40;
const WIDTH_S = 8;

function messages(label: string, count: number): BatchTask & { ids: string[] } {
  const ids: string[] = [];
  for (let n = 0; ids.length < count; n++) {
    const id = `${label}-${n}`;
    if (markerShardOf(markerDigest(id), SHARDS) === SHARD) ids.push(id);
  }
  return { vshard: SHARD, batchId: randomUUID(), ids, changes: ids.map((_, i) => [[`S${i % 50}`, 1]]) };
}

async function calls(redis: Redis, command: string): Promise<number> {
  const info = await redis.info('commandstats');
  return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('settled marker filters: a thread probes its copies, the script the bucket of now (a private Redis)', function () {
  this.timeout(90_000);
  let server: PrivateRedis;
  let admin: Redis;
  let client: Redis;
  const nowS = async () => Number((await admin.time())[0]);
  /** Settings of one test: its own prefix, so that the tests' writes in one bucket stay apart. */
  function settingsFor(mode: 'two-step' | 'atomic' = 'two-step'): WorkerSettings {
    return testWorkerSettings({
      redisUrl: server.url,
      prefix: `t.settled.${randomUUID().slice(0, 8)}:`,
      mode,
      markerScope: 'message',
      virtualShards: SHARDS,
      markerTtlS: TTL_S,
      markerBucketS: WIDTH_S,
    });
  }
  const runner = (mode: 'two-step' | 'atomic', settings: WorkerSettings) => (task: BatchTask) =>
    (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client, settings, task, quiet);
  /** What each test wrote before the tests, all in one bucket, and that bucket (settled by the time a test starts). */
  const written = new Map<string, { settings: WorkerSettings; batch: BatchTask & { ids: string[] } }>();
  let bucket: number;

  before(async () => {
    server = await startPrivateRedis();
    admin = server.admin();
    client = createRedisClient(server.url, 'test-settled-filters');
    const plans = [
      { name: 'copy', mode: 'two-step' as const, count: 3_000 },
      { name: 'two-step', mode: 'two-step' as const, count: 500 },
      { name: 'atomic', mode: 'atomic' as const, count: 500 },
      { name: 'size', mode: 'two-step' as const, count: 200 },
    ];
    while ((await nowS()) % WIDTH_S !== 0) await sleep(50);
    bucket = Math.floor((await nowS()) / WIDTH_S);
    for (const { name, mode, count } of plans) {
      const settings = settingsFor(mode);
      const batch = messages(name, count);
      expect([...(await runner(mode, settings)(batch)).marked].every((flag) => flag === 0)).to.equal(true);
      written.set(name, { settings, batch });
    }
    expect(Math.floor((await nowS()) / WIDTH_S), 'every batch written in one bucket').to.equal(bucket);
    while ((await nowS()) < (bucket + 2) * WIDTH_S) await sleep(100);
  });
  after(async () => {
    admin.disconnect();
    client.disconnect();
    await server.stop();
  });

  it("answers for every digest exactly as the server's filter does, bit for bit (byte order included)", async () => {
    const { settings, batch: copied } = written.get('copy')!;
    const shardKey = markerBaseKey(settings.prefix, SHARD);
    const copies = new SettledFilters(WIDTH_S, TTL_S);
    copies.observe(shardKey, await nowS(), admin, (error) => {
      throw error;
    });
    while (copies.heldBytes === 0) await sleep(20);
    const blocks = Number(await admin.hget(`${shardKey}:${bucket}:m`, 'f'));
    const others = Array.from({ length: 3_000 }, () => randomBytes(16));
    const digests = [...copied.ids.map(markerDigest), ...others];
    const vouched = copies.vouch(shardKey, digests);
    const flags = Buffer.from(vouched.flags);
    expect(vouched.buckets).to.equal(`${bucket}:${blocks}:${copied.ids.length}`);
    // The server's answer per digest: its block read with BITFIELD, as the script reads it.
    const serverSays: number[] = [];
    for (let from = 0; from < digests.length; from += 500) {
      const slots = digests.slice(from, from + 500).map((digest) => filterSlotOf(digest, blocks));
      const words = (await admin.call('BITFIELD', `${shardKey}:${bucket}:f`, ...slots.flatMap(({ block }) => ['GET', 'u32', `#${block}`]))) as number[];
      slots.forEach(({ bits }, i) => serverSays.push((words[i]! & bits) >>> 0 === bits ? 0x31 : 0x30));
    }
    expect([...flags]).to.deep.equal(serverSays);
    expect(
      flags.subarray(0, copied.ids.length).every((flag) => flag === 0x31),
      'every written digest may be held',
    ).to.equal(true);
    const falsePositives = flags.subarray(copied.ids.length).filter((flag) => flag === 0x31).length;
    expect(falsePositives, 'random digests the copy may hold').to.be.below(150);
  });

  for (const mode of ['two-step', 'atomic'] as const)
    it(`${mode}: catches a redelivery whose marker is in a settled bucket from the thread's copy; the script probes only the bucket of now`, async () => {
      const { settings, batch: first } = written.get(mode)!;
      const run = runner(mode, settings);
      // A batch after the bucket settled reports the time: the thread copies the settled filter in the background.
      await run(messages('later', 50));
      const copies = settledFiltersOf(WIDTH_S, TTL_S);
      while (!copies.vouch(markerBaseKey(settings.prefix, SHARD), [markerDigest(first.ids[0]!)]).buckets.startsWith(`${bucket}:`)) await sleep(20);
      const probes = await calls(admin, 'bitfield');
      const again = await run({ ...first, batchId: randomUUID() });
      expect(
        [...again.marked].filter((flag) => flag !== 1),
        'redeliveries counted as new',
      ).to.deep.equal([]);
      // The bucket of now has a filter (the later batch opened it): one BITFIELD for it, none for the settled bucket.
      expect((await calls(admin, 'bitfield')) - probes, 'filter probes in Redis').to.equal(1);
    });

  it("trusts a copy only while the bucket has the copy's block count and marker count (a late write since: probed by the script)", async () => {
    const { settings, batch: first } = written.get('size')!;
    const shardKey = markerBaseKey(settings.prefix, SHARD);
    const blocks = Number(await admin.hget(`${shardKey}:${bucket}:m`, 'f'));
    const markers = Number(await admin.hget(`${shardKey}:${bucket}:m`, 'n'));
    expect(markers).to.equal(first.ids.length);
    const digests = first.ids.map(markerDigest);
    // Flags that say "held by none": trusted, the redeliveries would read as new; otherwise the script finds them.
    const claim = (vouched: string) =>
      runScript(
        admin,
        CLAIM_MARKERS,
        evalshaArgs(
          CLAIM_MARKERS,
          [shardKey],
          [WIDTH_S, TTL_S, settings.markerSubBuckets, 12, 'b2', 30_000, vouched, Buffer.alloc(digests.length, 0x30), '', ...digests],
        ),
        quiet,
      ) as Promise<[string]>;
    const allDone = '1'.repeat(digests.length);
    expect((await claim(`${bucket}:${blocks + 64}:${markers}`))[0], 'a copy of another size').to.equal(allDone);
    expect((await claim(`${bucket}:${blocks}:${markers - 1}`))[0], 'a copy taken before the last marker write').to.equal(allDone);
    expect((await claim(`${bucket}:${blocks}:${markers}`))[0], 'a copy that matches is what decides').to.not.equal(allDone);
  });
});
