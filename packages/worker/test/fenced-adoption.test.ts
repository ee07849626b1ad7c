/**
 * Fenced adoption (fenced-adoption.ts) through runTwoStepBatch against a
 * real Redis: a batch that stops between its claim, its count writes and
 * its occupation, and the batch that claims its messages next. Each
 * scenario would count some message twice in two-step mode; with fenced
 * adoption every count is the truth. (A standalone Redis: the batches write
 * per count shard as on a cluster. The SIGKILLs on a real cluster are the
 * cluster fault run's, test-faults/10-cluster.fault.ts.)
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, PART_DONE, PART_NEW, receiptKey, shardOf, type BatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient } from '@tally/runtime';
import { readMarkers, testWorkerSettings } from '@tally/testkit';
import type { BatchHooks, BatchLog } from '../src/batch-log.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';
import { wholeMessagesOf } from './whole-messages.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const SHARDS = 16;
const CLAIM_TTL_MS = 300;

/** Resolves once opened; what awaits `wait` stays there until then. */
function gate(): { wait: () => Promise<void>; reached: Promise<void>; open: () => void } {
  let open!: () => void;
  let reached!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const arrived = new Promise<void>((resolve) => (reached = resolve));
  return {
    wait: () => {
      reached();
      return opened;
    },
    reached: arrived,
    open,
  };
}

const killed = (): never => {
  throw new Error('killed between the count writes and the occupation');
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('fenced adoption: a batch that stops midway, and the batch that adopts its messages', function () {
  this.timeout(30_000);
  let redis: Redis;
  let client: Redis;
  let prefix: string;
  let runId: string;
  let warnings: string[];
  const log: BatchLog = { warn: (_fields, message) => warnings.push(message), error() {} };

  /** A daemon's settings: its own claim token, atomic mode on a prefix of fenced adoption. */
  const daemon = (claimToken: string): WorkerSettings =>
    testWorkerSettings({
      redisUrl: REDIS_URL,
      prefix,
      mode: 'atomic',
      markerScope: 'message',
      fencedAdoption: true,
      virtualShards: SHARDS,
      claimToken,
      claimTtlMs: CLAIM_TTL_MS,
    });
  const run = (claimToken: string, task: BatchTask, hooks: BatchHooks = {}) => runTwoStepBatch(client, daemon(claimToken), task, log, hooks);
  /** The same messages redelivered: a new batch, a new id. */
  const redelivered = (task: BatchTask): BatchTask => ({ ...task, batchId: randomUUID() });

  async function expectCountedOnce(task: BatchTask, what: string): Promise<void> {
    const truth = new Map<string, number>();
    for (const part of task.changes) for (const [sku, delta] of part) truth.set(sku, (truth.get(sku) ?? 0) + delta);
    const counts = new Map<string, number>();
    for (const sku of truth.keys()) counts.set(sku, Number(await redis.get(countKey(prefix, shardOf(sku, SHARDS), sku))));
    expect(Object.fromEntries(counts), what).to.deep.equal(Object.fromEntries(truth));
  }

  beforeEach(() => {
    runId = randomBytes(4).toString('hex');
    prefix = `t.fenced.${runId}:`;
    warnings = [];
    redis = new Redis(REDIS_URL);
    client = createRedisClient(REDIS_URL, 'test-fenced-adoption');
  });
  afterEach(async () => {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
    client.disconnect();
  });

  it("killed between its count writes and its occupation: the next batch adopts its messages' counts, counted once", async () => {
    const task = wholeMessagesOf(runId, 1, 30, SHARDS);
    await run('aa', task, { afterCountWrite: killed }).then(
      () => expect.fail('the batch was to be killed'),
      (error: Error) => expect(error.message).to.match(/^killed/),
    );
    await expectCountedOnce(task, "the dead batch's counts");
    expect((await readMarkers(redis, prefix)).done.size, 'no marker occupied').to.equal(0);
    // Its receipts outlive its claims, which live the marker TTL from the end of their bucket: else found gone, fenced, counted again.
    const { markerTtlS, markerBucketS } = daemon('aa');
    const receiptTtls = await Promise.all((await redis.keys(receiptKey(prefix, 0, '*').replace('{0}', '{*}'))).map((key) => redis.ttl(key)));
    expect(receiptTtls.length).to.be.greaterThan(3);
    for (const ttl of receiptTtls) expect(ttl).to.be.within(markerTtlS + 1, markerTtlS + markerBucketS);

    await sleep(CLAIM_TTL_MS + 50);
    const adopter = await run('bb', redelivered(task));
    expect([...adopter.marked], 'every message claimed anew, over the dead claims').to.deep.equal(new Array(30).fill(PART_NEW));
    expect(adopter.claimTakeovers).to.equal(30);
    await expectCountedOnce(task, 'adopted, not counted again');
    expect((await readMarkers(redis, prefix)).done.size).to.equal(30);
    expect([...(await run('bb', redelivered(task))).marked], 'then a redelivery is a duplicate').to.deep.equal(new Array(30).fill(PART_DONE));
  });

  it('stalled between its claim and its count writes: fenced out by the adopter, it writes nothing and runs again under a new id', async () => {
    const task = wholeMessagesOf(runId, 2, 30, SHARDS);
    const stall = gate();
    const stalled = run('aa', task, { beforeCountWrite: stall.wait });
    await stall.reached;
    await sleep(CLAIM_TTL_MS + 50);
    const adopter = await run('bb', redelivered(task));
    expect([...adopter.marked]).to.deep.equal(new Array(30).fill(PART_NEW));
    await expectCountedOnce(task, "the adopter's counts");

    stall.open();
    const woken = await stalled;
    expect(
      warnings.filter((w) => w.startsWith('batch fenced out by an adopter')),
      'fenced, then run again',
    ).to.have.length(1);
    expect([...woken.marked], 'under its new id: all duplicates of the adopter').to.deep.equal(new Array(30).fill(PART_DONE));
    await expectCountedOnce(task, 'the stalled batch wrote nothing');
  });

  it('stalled after its count writes: the adopter writes nothing again, and both occupy', async () => {
    const task = wholeMessagesOf(runId, 3, 30, SHARDS);
    const stall = gate();
    const stalled = run('aa', task, { afterCountWrite: stall.wait });
    await stall.reached;
    await sleep(CLAIM_TTL_MS + 50);
    expect([...(await run('bb', redelivered(task))).marked]).to.deep.equal(new Array(30).fill(PART_NEW));
    await expectCountedOnce(task, 'adopted');
    stall.open();
    expect([...(await stalled).marked]).to.deep.equal(new Array(30).fill(PART_NEW));
    await expectCountedOnce(task, 'counted once, by the stalled batch');
    expect((await readMarkers(redis, prefix)).done.size).to.equal(30);
  });

  it('an adopter that abandons (a shard refuses its write for its data) leaves what it adopted: the stalled batch occupies, counted once', async () => {
    const task = wholeMessagesOf(runId, 1, 20, SHARDS);
    const stall = gate();
    const stalled = run('aa', task, { afterCountWrite: stall.wait });
    await stall.reached;
    await sleep(CLAIM_TTL_MS + 50);
    // The adopter's receipt key on one count shard holds a foreign type: its write there fails for its data.
    const adopter = redelivered(task);
    await redis.hset(receiptKey(prefix, shardOf('A0', SHARDS), adopter.batchId), 'foreign', '1');
    await run('bb', adopter).then(
      () => expect.fail('the adopter was to fail for its data'),
      (error: Error) => expect(error.message).to.match(/WRONGTYPE/),
    );
    await expectCountedOnce(task, 'the adopter took back nothing it had adopted');
    stall.open();
    expect([...(await stalled).marked], 'the stalled batch wakes and occupies').to.deep.equal(new Array(20).fill(PART_NEW));
    await expectCountedOnce(task, 'counted once, by the stalled batch');
  });

  it("adopts this daemon's own claims under another id at once (a split batch, a batch run again), and a chain of two dead batches", async () => {
    const task = wholeMessagesOf(runId, 0, 30, SHARDS);
    await run('aa', task, { afterCountWrite: killed }).catch(() => {});
    // The same daemon, a new id, no wait for the claim TTL: its earlier batch has ended.
    await run('aa', redelivered(task), { afterCountWrite: killed }).catch(() => {});
    await expectCountedOnce(task, 'the second batch adopted the first');
    await sleep(CLAIM_TTL_MS + 50);
    // A third batch on another daemon reads the chain: the first batch counted, the second adopted.
    const third = await run('cc', redelivered(task));
    expect([...third.marked]).to.deep.equal(new Array(30).fill(PART_NEW));
    await expectCountedOnce(task, 'the chain adopted whole');
  });
});
