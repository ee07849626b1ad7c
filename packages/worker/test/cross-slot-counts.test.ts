import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { classifyError, countKey, markerDigest, PART_DONE, PART_NEW, receiptKey, shardOf, standingKey, type BatchTask } from '@tally/shared';
import { createRedisClient, keySlot, type RedisClient } from '@tally/runtime';
import { startRedisCluster, testWorkerSettings, type RedisCluster } from '@tally/testkit';
import type { BatchLog } from '../src/batch-log.js';
import { groupByCountShard, TAKE_BACK_COUNTS, takeBackReceiptId, writeCountsAcrossSlots, type CrossSlotDeps } from '../src/cross-slot-counts.js';
import { evalshaArgs, runScript } from '../src/lua-scripts.js';
import { WRITE_COUNTS } from '../src/two-step-batch.js';
import { BatchWritesLostError } from '../src/replica-wait.js';

/** A batch of the messages given, one part each, with ids `<prefix>m0`, `<prefix>m1`, … */
function batchOf(prefix: string, ...messages: Array<Array<[string, number]>>): BatchTask {
  return { vshard: 0, batchId: randomUUID(), ids: messages.map((_, i) => `${prefix}m${i}`), changes: messages };
}

describe('cross-slot counts: grouping a message-scoped batch by count shard (pure)', () => {
  const SHARDS = 16;
  const changes: Array<Array<[string, number]>> = [
    [
      ['A', 1],
      ['B', 2],
      ['C', 3],
    ],
    [
      ['A', 10],
      ['D', -4],
    ],
    [['B', 100]],
  ];

  it("sums each new part's changes into its SKU's own shard, and names the parts each shard got", () => {
    const groups = groupByCountShard(changes, Uint8Array.of(PART_NEW, PART_NEW, PART_NEW), SHARDS);
    const byShard = new Map(groups.map((g) => [g.shard, g]));
    const sums = new Map<string, number>();
    for (const group of groups) {
      for (const [sku, sum] of group.sums) {
        expect(shardOf(sku, SHARDS), `${sku} written on its own shard`).to.equal(group.shard);
        sums.set(sku, Number(sum));
      }
    }
    expect(Object.fromEntries(sums)).to.deep.equal({ A: 11, B: 102, C: 3, D: -4 });
    expect(byShard.get(shardOf('A', SHARDS))!.parts).to.include.members([0, 1]);
    expect(byShard.get(shardOf('D', SHARDS))!.parts).to.include(1);
    expect(byShard.get(shardOf('C', SHARDS))!.parts).to.include(0);
  });

  it('leaves out parts that are not new (duplicates and held parts write nothing)', () => {
    const groups = groupByCountShard(changes, Uint8Array.of(PART_DONE, PART_NEW, PART_DONE), SHARDS);
    const all = new Map(groups.flatMap((g) => [...g.sums]));
    expect(Object.fromEntries([...all].map(([k, v]) => [k, Number(v)]))).to.deep.equal({ A: 10, D: -4 });
    for (const group of groups) expect(group.parts).to.deep.equal([1]);
  });
});

describe('cross-slot counts: an undo Redis refuses (a key changed between the write and the undo)', function () {
  this.timeout(30_000);
  const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
  const SHARDS = 16;
  const prefix = `test:undo:${randomUUID()}:`;
  const redis = new Redis(REDIS_URL);

  after(async () => {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  /** A batch (every part new) written across slots here, through `client`, its error lines and undo failures collected. */
  function writer(prefix: string, task: BatchTask, client: Redis = redis) {
    const errors: Array<{ fields: Record<string, unknown>; message: string }> = [];
    const undoFailures: number[] = [];
    const write = () =>
      writeCountsAcrossSlots({
        redis: client,
        settings: testWorkerSettings({ redisUrl: REDIS_URL, prefix, virtualShards: SHARDS }),
        task,
        groups: groupByCountShard(task.changes, new Uint8Array(task.changes.length).fill(PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log: { warn() {}, error: (fields, message) => errors.push({ fields, message }) },
        untilDone: (_step, run) => run(),
        onUndoFailed: (_task, parts) => undoFailures.push(parts),
      });
    return { write, errors, undoFailures };
  }

  /**
   * A batch of two messages refused on one count shard, whose undo on another shard finds one key changed by hand
   * (in `prefix`): what stands is that key's increments.
   */
  function refusedUndo(prefix: string) {
    // The message is refused on one count shard, so its counts on another are undone: two SKUs there, one of which changes.
    const refusedSku = 'sku-a';
    const others = Array.from({ length: 200 }, (_, i) => `sku-b${i}`).filter((sku) => shardOf(sku, SHARDS) !== shardOf(refusedSku, SHARDS));
    const [changingSku, undoneSku] = others.filter((sku) => shardOf(sku, SHARDS) === shardOf(others[0]!, SHARDS));
    const shard = shardOf(changingSku!, SHARDS);
    const refusedKey = countKey(prefix, shardOf(refusedSku, SHARDS), refusedSku);
    const changingKey = countKey(prefix, shard, changingSku!);
    const undoneKey = countKey(prefix, shard, undoneSku!);
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      ids: [`${prefix}m1`, `${prefix}m2`],
      changes: [
        [
          [refusedSku, 3],
          [changingSku!, 5],
          [undoneSku!, 7],
        ],
        // A second refused message sharing the changing SKU: each dead letter must name its own share of what stands.
        [
          [refusedSku, 1],
          [changingSku!, 2],
        ],
      ],
    };
    // One key on the other shard turns foreign just as the undo arrives.
    const client = new Redis(REDIS_URL);
    const turnsForeign = new Proxy(client, {
      get(target, property, receiver) {
        if (property !== 'call') return Reflect.get(target, property, receiver);
        return async (command: string, args: Array<string | number>) => {
          if (command === 'EVALSHA' && args.some((arg) => String(arg).includes('~undo:')) && (await redis.get(changingKey)) === '7')
            await redis.set(changingKey, 'changed by hand');
          return target.call(command, args);
        };
      },
    });
    const errors: Array<{ fields: Record<string, unknown>; message: string }> = [];
    const log: BatchLog = { warn() {}, error: (fields, message) => errors.push({ fields, message }) };
    const undoFailures: number[] = [];
    const write = () =>
      writeCountsAcrossSlots({
        redis: turnsForeign,
        settings: testWorkerSettings({ redisUrl: REDIS_URL, prefix, virtualShards: SHARDS }),
        task,
        groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW, PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log,
        untilDone: (_step, run) => run(),
        onUndoFailed: (_task, parts) => undoFailures.push(parts),
      });
    return { task, client, errors, undoFailures, write, refusedKey, changingKey, undoneKey, shard };
  }

  it('undoes every other key, leaves the changed one standing, counts its part once and names the key and the delta to subtract', async () => {
    const { task, client, errors, undoFailures, write, refusedKey, changingKey, undoneKey, shard } = refusedUndo(prefix);
    await redis.set(refusedKey, 'a foreign value');
    try {
      const result = await write();
      expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0, 1]);
      expect(undoFailures, 'both refused parts have counts standing').to.deep.equal([2]);
      expect(
        result.refusals.map((refusal) => refusal.standing),
        "each part's own share, for its dead letter",
      ).to.deep.equal([{ [changingKey]: '5' }, { [changingKey]: '2' }]);
      expect(errors).to.have.length(1);
      expect(errors[0]!.fields.stand, 'only the changed key, with the increment that stands').to.deep.equal({ [changingKey]: '7' });
      expect(errors[0]!.fields.refusedKeys, "the key the dead letter's reason names").to.deep.equal([refusedKey]);
      expect(errors[0]!.message).to.include('subtract its delta');
      // A count of 0 reads the same as no key.
      expect(Number((await redis.get(undoneKey)) ?? 0), 'every other key on the shard is undone').to.equal(0);
      expect(await redis.get(refusedKey), 'the foreign key is never touched').to.equal('a foreign value');
      expect(
        await redis.exists(receiptKey(prefix, shard, takeBackReceiptId(task.batchId, 0)), receiptKey(prefix, shard, takeBackReceiptId(task.batchId, 1))),
        "each part's undo receipt, for a WAIT and a rerun",
      ).to.equal(2);
      // The same shares in Redis by message digest, for a dead letter that loses its header.
      const recorded = await Promise.all(task.ids!.map((id) => redis.hgetall(standingKey(prefix, markerDigest(id).toString('hex')))));
      expect(recorded).to.deep.equal([{ [changingKey]: '5' }, { [changingKey]: '2' }]);
      expect(await redis.ttl(standingKey(prefix, markerDigest(task.ids![0]!).toString('hex'))), 'kept for the count TTL').to.be.greaterThan(0);

      // A rerun under the batch id finds the receipts: nothing undone again, the standing count logged again but counted once.
      const rerun = await write();
      expect(undoFailures).to.deep.equal([2]);
      expect(
        rerun.refusals.map((refusal) => refusal.standing),
        'a rerun reads what stands from the receipt',
      ).to.deep.equal([{ [changingKey]: '5' }, { [changingKey]: '2' }]);
      expect(errors).to.have.length(2);
      expect(errors[1]!.fields.rerun).to.equal(true);
      expect(Number((await redis.get(undoneKey)) ?? 0), 'not undone twice').to.equal(0);
    } finally {
      client.disconnect();
    }
  });

  it('logs a standing record Redis refuses (its key holds another type) and neither fails the batch nor lets it be counted twice', async () => {
    // Thrown, the refusal failed a batch whose counts were written and undone: isolation then wrote its halves again.
    const recordPrefix = `${prefix}record-refused:`;
    const { task, client, errors, undoFailures, write, refusedKey, changingKey, undoneKey } = refusedUndo(recordPrefix);
    await redis.set(refusedKey, 'a foreign value');
    const recordOf = (id: string) => standingKey(recordPrefix, markerDigest(id).toString('hex'));
    await redis.set(recordOf(task.ids![1]!), 'not a hash');
    try {
      const result = await write();
      expect(
        result.refusals.map((refusal) => refusal.standing),
        'the dead letters still name what stands',
      ).to.deep.equal([{ [changingKey]: '5' }, { [changingKey]: '2' }]);
      expect(undoFailures).to.deep.equal([2]);
      const recordErrors = errors.filter((error) => error.fields.key === recordOf(task.ids![1]!));
      expect(recordErrors, 'one error line for the record it could not write').to.have.length(1);
      expect(recordErrors[0]!.fields.stand).to.deep.equal({ [changingKey]: '2' });
      expect(recordErrors[0]!.message).to.include('Delete the key');
      expect(await redis.ttl(recordOf(task.ids![1]!)), 'the key the line names is left as it was, with no TTL of ours').to.equal(-1);
      expect(await redis.hgetall(recordOf(task.ids![0]!)), "the other message's record is written").to.deep.equal({ [changingKey]: '5' });
      expect(Number((await redis.get(undoneKey)) ?? 0), 'undone once').to.equal(0);
    } finally {
      client.disconnect();
    }
  });

  it('an undo refused for its data before any write (a foreign undo receipt): every increment there stands, reported, and the batch goes on', async () => {
    // Thrown, it sent a batch whose shards were all written to isolation with nothing taken back: counted twice.
    const undoPrefix = `${prefix}undo-refused:`;
    const refusedSku = 'sku-a';
    const otherSku = Array.from({ length: 200 }, (_, i) => `sku-b${i}`).find((sku) => shardOf(sku, SHARDS) !== shardOf(refusedSku, SHARDS))!;
    const shard = shardOf(otherSku, SHARDS);
    const otherKey = countKey(undoPrefix, shard, otherSku);
    await redis.set(countKey(undoPrefix, shardOf(refusedSku, SHARDS), refusedSku), 'a foreign value');
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      ids: [`${undoPrefix}m1`],
      changes: [
        [
          [refusedSku, 3],
          [otherSku, 5],
        ],
      ],
    };
    await redis.hset(receiptKey(undoPrefix, shard, takeBackReceiptId(task.batchId, 0)), 'foreign', '1');
    const { write, errors, undoFailures } = writer(undoPrefix, task);
    const result = await write();
    expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
    expect(result.refusals[0]!.standing, 'the dead letter names what stands').to.deep.equal({ [otherKey]: '5' });
    expect(await redis.get(otherKey), 'written once, not taken back, not written again').to.equal('5');
    expect(undoFailures).to.deep.equal([1]);
    expect(errors).to.have.length(1);
    expect(errors[0]!.fields.stand).to.deep.equal({ [otherKey]: '5' });
    expect(String((errors[0]!.fields.errors as Record<string, string>)[otherKey])).to.match(/WRONGTYPE/);
    expect(await redis.hgetall(standingKey(undoPrefix, markerDigest(task.ids![0]!).toString('hex'))), 'recorded for a letter without its header').to.deep.equal(
      {
        [otherKey]: '5',
      },
    );
  });

  /** A SKU whose count key (in `prefix`) holds a foreign value, so every part with it is refused, and two SKUs that share another shard. */
  async function poisonedSkuAndTwoOthers(prefix: string): Promise<{ refusedSku: string; b1: string; b2: string; shardB: number }> {
    const refusedSku = 'sku-a';
    const others = Array.from({ length: 200 }, (_, i) => `sku-b${i}`).filter((sku) => shardOf(sku, SHARDS) !== shardOf(refusedSku, SHARDS));
    const [b1, b2] = others.filter((sku) => shardOf(sku, SHARDS) === shardOf(others[0]!, SHARDS));
    await redis.set(countKey(prefix, shardOf(refusedSku, SHARDS), refusedSku), 'a foreign value');
    return { refusedSku, b1: b1!, b2: b2!, shardB: shardOf(b1!, SHARDS) };
  }

  it("takes back a shard's refused parts in one call, each under its own receipt: a foreign one leaves only its part standing", async () => {
    // Before, one script per refused part and shard: a poisoned hot key refusing 500 parts cost 500 calls, not 1.
    const onePrefix = `${prefix}one-call:`;
    const { refusedSku, b1, b2, shardB } = await poisonedSkuAndTwoOthers(onePrefix);
    // Six messages, all refused on A's poisoned key; on B they share b1, and half of them touch b2.
    const messages = Array.from({ length: 6 }, (_, i): Array<[string, number]> => [
      [refusedSku, 1],
      [b1, i + 1],
      ...(i % 2 === 0 ? [[b2, 10 * (i + 1)] as [string, number]] : []),
    ]);
    const task = batchOf(onePrefix, ...messages);
    await redis.set(countKey(onePrefix, shardB, b1), '1000');
    // Part 2's take-back receipt holds another type: its increments on B stand, the others' are taken back.
    await redis.hset(receiptKey(onePrefix, shardB, takeBackReceiptId(task.batchId, 2)), 'foreign', '1');
    // The scripts sent with a take-back receipt among their keys, counted as Redis receives them.
    let takeBackCalls = 0;
    const counting = new Proxy(redis, {
      get(target, property, receiver) {
        if (property !== 'call') return Reflect.get(target, property, receiver);
        return async (command: string, args: Array<string | number>) => {
          const reply = await target.call(command, args);
          // Counted once answered: the first one after a fresh start is NOSCRIPT, loaded and sent again.
          if (command === 'EVALSHA' && args.some((arg) => String(arg).includes('~undo:'))) takeBackCalls++;
          return reply;
        };
      },
    });
    const { write } = writer(onePrefix, task, counting);
    const result = await write();
    expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0, 1, 2, 3, 4, 5]);
    expect(takeBackCalls, 'one take-back call for the shard').to.equal(1);
    expect(await redis.get(countKey(onePrefix, shardB, b1)), "b1: only part 2's 3 stands").to.equal('1003');
    expect(await redis.get(countKey(onePrefix, shardB, b2)), "b2: only part 2's 30 stands").to.equal('30');
    expect(result.refusals[2]!.standing).to.deep.equal({ [countKey(onePrefix, shardB, b1)]: '3', [countKey(onePrefix, shardB, b2)]: '30' });
    expect(result.refusals.filter((refusal) => refusal.standing !== undefined).map((refusal) => refusal.part)).to.deep.equal([2]);
    for (const part of [0, 1, 3, 4, 5])
      expect(await redis.exists(receiptKey(onePrefix, shardB, takeBackReceiptId(task.batchId, part))), `part ${part}'s receipt`).to.equal(1);

    // A rerun finds the receipts: nothing is taken back twice, and what stands is the same.
    const rerun = await write();
    expect([await redis.get(countKey(onePrefix, shardB, b1)), await redis.get(countKey(onePrefix, shardB, b2))]).to.deep.equal(['1003', '30']);
    expect(rerun.refusals[2]!.standing).to.deep.equal(result.refusals[2]!.standing);
  });

  it('reads a take-back receipt as written, and one of a shape no take-back writes as foreign: its part stands, the others go on', async () => {
    // A plain string read as a receipt made its part pass for taken back, its increments standing unreported; one with a
    // ':' but no JSON stopped the whole call mid-way, retried for ever.
    const shapesPrefix = `${prefix}receipt-shapes:`;
    const { refusedSku, b1, b2, shardB } = await poisonedSkuAndTwoOthers(shapesPrefix);
    const [keyB1, keyB2] = [countKey(shapesPrefix, shardB, b1), countKey(shapesPrefix, shardB, b2)];
    const task = batchOf(
      shapesPrefix,
      ...Array.from({ length: 4 }, (_, i): Array<[string, number]> => [
        [refusedSku, 1],
        [b1, 10 ** i],
        [b2, 2],
      ]),
    );
    const receiptOf = (part: number) => receiptKey(shapesPrefix, shardB, takeBackReceiptId(task.batchId, part));
    // Part 0: a receipt an earlier take-back wrote, b2's increment refused then (its 2 stands). Parts 1 and 2: values
    // no take-back writes. Part 3: none, taken back now.
    await redis.set(receiptOf(0), `01:${JSON.stringify([[2, keyB2, '-2', 'ERR by hand']])}`);
    await redis.set(receiptOf(1), 'hello');
    await redis.set(receiptOf(2), '01:not json');
    const result = await writer(shapesPrefix, task).write();
    expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0, 1, 2, 3]);
    expect(result.refusals[0]!.standing, "the earlier take-back's answer").to.deep.equal({ [keyB2]: '2' });
    expect(result.refusals[1]!.standing, 'a plain string: its part stands whole').to.deep.equal({ [keyB1]: '10', [keyB2]: '2' });
    expect(result.refusals[2]!.standing, 'a value that is no receipt: its part stands whole').to.deep.equal({ [keyB1]: '100', [keyB2]: '2' });
    expect(result.refusals[3]!.standing, 'taken back now').to.equal(undefined);
    // Written by this batch: 1111 on b1 and 8 on b2; only part 3 is taken back now (the receipt written by hand for
    // part 0 stands for a take-back that never ran).
    expect([await redis.get(keyB1), await redis.get(keyB2)]).to.deep.equal(['111', '6']);
    expect([await redis.get(receiptOf(1)), await redis.get(receiptOf(2))], 'the foreign values left as they were').to.deep.equal(['hello', '01:not json']);
  });

  it('refuses take-back arguments that name no count key or no integer, before any write', async () => {
    const argsPrefix = `${prefix}take-back-args:`;
    const [receipt, key] = [`${argsPrefix}w:{1}:b~undo:0`, `${argsPrefix}c:{1}:sku`];
    const call = (argv: Array<string | number>) =>
      runScript(redis, TAKE_BACK_COUNTS, evalshaArgs(TAKE_BACK_COUNTS, [receipt, key], argv), { warn() {} }).then(
        () => null,
        (error: Error) => error.message,
      );
    expect(await call([60, 60, 1, 1, 1, '-5']), 'the receipt as a count key').to.match(/^TALLY_SCRIPT_ARGS .*names no count key/);
    expect(await call([60, 60, 1, 1, 3, '-5']), 'past the keys').to.match(/^TALLY_SCRIPT_ARGS .*names no count key/);
    expect(await call([60, 60, 1, 1, 2, 'abc']), 'not an integer').to.match(/^TALLY_SCRIPT_ARGS .*not an integer/);
    expect(await call([60, 60, 1, 2, 2, '-5']), 'too few ARGV').to.match(/^TALLY_SCRIPT_ARGS/);
    expect(await call([60, 60, 2, 1, 2, '-5']), 'more parts than keys allow').to.match(/^TALLY_SCRIPT_ARGS/);
    expect(await redis.exists(receipt, key), 'nothing written').to.equal(0);
    expect(await call([60, 60, 1, 1, 2, '-5'])).to.equal(null);
    expect([await redis.get(receipt), await redis.get(key)]).to.deep.equal(['1', '-5']);
  });

  it('gives a receipt key of another type no TTL while the batch keeps its receipts alive', async () => {
    // Receipts are kept alive from their first attempt; one refused for its data (the key the error line names for the
    // operator) must not expire on its own, as it would after the next refresh.
    const foreignPrefix = `${prefix}foreign-receipt-ttl:`;
    const refusedSku = 'sku-a';
    const otherSku = Array.from({ length: 200 }, (_, i) => `sku-b${i}`).find((sku) => shardOf(sku, SHARDS) !== shardOf(refusedSku, SHARDS))!;
    await redis.set(countKey(foreignPrefix, shardOf(refusedSku, SHARDS), refusedSku), 'a foreign value');
    const task = batchOf(foreignPrefix, [
      [refusedSku, 3],
      [otherSku, 5],
    ]);
    const foreignReceipt = receiptKey(foreignPrefix, shardOf(otherSku, SHARDS), takeBackReceiptId(task.batchId, 0));
    await redis.hset(foreignReceipt, 'foreign', '1');
    const result = await writeCountsAcrossSlots({
      redis,
      settings: testWorkerSettings({ redisUrl: REDIS_URL, prefix: foreignPrefix, virtualShards: SHARDS, markerTtlS: 1 }),
      task,
      groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW), SHARDS),
      writeCounts: WRITE_COUNTS,
      log: { warn() {}, error() {} },
      // The standing record's write takes three refresh periods (a third of the marker TTL each).
      untilDone: async (step, run) => {
        if (step === 'record_standing') await new Promise((resolve) => setTimeout(resolve, 1_100));
        return run();
      },
    });
    expect(result.refusals[0]!.standing, 'the batch went through its refused take-back').to.deep.equal({
      [countKey(foreignPrefix, shardOf(otherSku, SHARDS), otherSku)]: '5',
    });
    expect(await redis.ttl(foreignReceipt), 'the foreign key keeps no TTL').to.equal(-1);
  });

  it("takes back the other shards' counts when one shard's write fails for its data, once, before the batch is split", async () => {
    // Batch isolation reruns a failed batch's halves under new ids, writing every shard again: a shard written under the
    // failed id would count twice. Here shard B's write receipt holds a foreign type, so its GET fails (WRONGTYPE).
    const skus = Array.from({ length: 200 }, (_, i) => `abandon-${i}`);
    const [skuA, skuA2] = skus.filter((sku) => shardOf(sku, SHARDS) === shardOf(skus[0]!, SHARDS));
    const skuB = skus.find((sku) => shardOf(sku, SHARDS) !== shardOf(skuA!, SHARDS))!;
    const shardA = shardOf(skuA!, SHARDS);
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      changes: [
        [
          [skuA!, 4],
          [skuB, 1],
        ],
        [[skuA2!, 9]],
      ],
    };
    await redis.hset(receiptKey(prefix, shardOf(skuB, SHARDS), task.batchId), 'foreign', '1');
    await redis.set(countKey(prefix, shardA, skuA!), '100');
    const warnings: string[] = [];
    const log: BatchLog = { warn: (_fields, message) => warnings.push(message), error() {} };
    const write = () =>
      writeCountsAcrossSlots({
        redis,
        settings: testWorkerSettings({ redisUrl: REDIS_URL, prefix, virtualShards: SHARDS }),
        task,
        groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW, PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log,
        untilDone: (_step, run) => run(),
      });
    const failure = await write().then(
      () => null,
      (error: Error) => error,
    );
    expect(failure?.message, 'the data failure reaches batch isolation').to.match(/WRONGTYPE/);
    expect(await redis.get(countKey(prefix, shardA, skuA!)), 'shard A written, then taken back').to.equal('100');
    expect(Number((await redis.get(countKey(prefix, shardA, skuA2!))) ?? 0)).to.equal(0);
    expect(await redis.exists(receiptKey(prefix, shardA, takeBackReceiptId(task.batchId, 0))), 'taken back under a receipt of its own').to.equal(1);
    expect(warnings.some((message) => message.includes('taking back'))).to.equal(true);

    // A rerun of the same id fails the same way and takes back nothing twice.
    await write().catch(() => {});
    expect(await redis.get(countKey(prefix, shardA, skuA!)), 'not taken back twice').to.equal('100');
  });

  it('records what a refused take-back leaves standing by message, so the one-part dead letter is not replayed blind', async () => {
    // A one-part run that fails for its data is dead-lettered count-refused with no standing header (the failure is
    // thrown, not returned): the Redis record is all `tally dead replay` has.
    const takeBackPrefix = `${prefix}take-back-refused:`;
    const skus = Array.from({ length: 200 }, (_, i) => `abandon-${i}`);
    const skuA = skus[0]!;
    const skuB = skus.find((sku) => shardOf(sku, SHARDS) !== shardOf(skuA, SHARDS))!;
    const shardA = shardOf(skuA, SHARDS);
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      ids: [`${takeBackPrefix}m1`],
      changes: [
        [
          [skuA, 4],
          [skuB, 1],
        ],
      ],
    };
    await redis.hset(receiptKey(takeBackPrefix, shardOf(skuB, SHARDS), task.batchId), 'foreign', '1');
    await redis.hset(receiptKey(takeBackPrefix, shardA, takeBackReceiptId(task.batchId, 0)), 'foreign', '1');
    const { write, errors, undoFailures } = writer(takeBackPrefix, task);
    const failure = await write().then(
      () => null,
      (error: Error) => error,
    );
    const keyA = countKey(takeBackPrefix, shardA, skuA);
    expect(failure?.message, 'the data failure still reaches batch isolation').to.match(/WRONGTYPE/);
    expect(await redis.get(keyA), 'written, and the take-back refused').to.equal('4');
    expect(undoFailures).to.deep.equal([1]);
    expect(errors.map((error) => error.fields.stand)).to.deep.equal([{ [keyA]: '4' }]);
    expect(
      await redis.hgetall(standingKey(takeBackPrefix, markerDigest(task.ids![0]!).toString('hex'))),
      "the message's standing counts, for `tally dead replay`",
    ).to.deep.equal({ [keyA]: '4' });
  });

  /** One message of +3 on shard A and +5 on shard B, in `prefix`. */
  function oneMessageOnTwoShards(prefix: string) {
    const skus = Array.from({ length: 200 }, (_, i) => `taken-back-${i}`);
    const skuA = skus[0]!;
    const skuB = skus.find((sku) => shardOf(sku, SHARDS) !== shardOf(skuA, SHARDS))!;
    const [shardA, shardB] = [shardOf(skuA, SHARDS), shardOf(skuB, SHARDS)];
    const task = batchOf(prefix, [
      [skuA, 3],
      [skuB, 5],
    ]);
    return { task, shardA, shardB, keyA: countKey(prefix, shardA, skuA), keyB: countKey(prefix, shardB, skuB) };
  }
  const count = async (key: string): Promise<number> => Number((await redis.get(key)) ?? 0);

  it('a rerun that finds a part taken back but refused by no receipt now (the refusal lost in a failover) keeps it refused', async () => {
    // Before, the rerun counted the part on A again (its refusing key lost with the receipt) and found B's receipt,
    // under which the part had been taken back: the message marked counted with its 5 on B gone.
    const takenPrefix = `${prefix}taken-back-lost:`;
    const { task, shardA, keyA, keyB } = oneMessageOnTwoShards(takenPrefix);
    await redis.set(keyA, 'a foreign value');
    const first = await writer(takenPrefix, task).write();
    expect(first.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
    expect(await count(keyB), 'undone on B').to.equal(0);
    // The thread dies before the occupation; a failover then loses A's receipt and the foreign key (never WAITed for).
    await redis.del(receiptKey(takenPrefix, shardA, task.batchId), keyA);

    const { write, errors } = writer(takenPrefix, task);
    const rerun = await write();
    expect(
      rerun.refusals.map((refusal) => [refusal.part, refusal.error.split(' ')[0]]),
      'still refused, with the take-back as its reason',
    ).to.deep.equal([[0, 'TALLY_TAKEN_BACK']]);
    expect([await count(keyA), await count(keyB)], 'counted nowhere: its replay counts it once').to.deep.equal([0, 0]);
    expect(errors, 'nothing stands').to.deep.equal([]);
    const again = await write();
    expect(again.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
    expect([await count(keyA), await count(keyB)], 'a second rerun changes nothing').to.deep.equal([0, 0]);
  });

  it('a rerun after an abandon whose failing shard was mended since keeps the taken-back part refused', async () => {
    // Before, the rerun found A's receipt (its counts taken back by the abandon) and wrote B: the message marked counted
    // with its 3 on A gone.
    const mendedPrefix = `${prefix}taken-back-mended:`;
    const { task, shardB, keyA, keyB } = oneMessageOnTwoShards(mendedPrefix);
    const receiptB = receiptKey(mendedPrefix, shardB, task.batchId);
    await redis.hset(receiptB, 'foreign', '1');
    const failure = await writer(mendedPrefix, task)
      .write()
      .then(
        () => null,
        (error: Error) => error,
      );
    expect(failure?.message).to.match(/WRONGTYPE/);
    expect(await count(keyA), 'taken back on A').to.equal(0);
    // The thread dies before the failure reaches the coordinator, which reruns the id; meanwhile B's key is mended.
    await redis.del(receiptB);

    const rerun = await writer(mendedPrefix, task).write();
    expect(rerun.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
    expect([await count(keyA), await count(keyB)], 'counted nowhere: its replay counts it once').to.deep.equal([0, 0]);
  });
});

/**
 * With WAIT on a Redis Cluster, what the undo paths write must reach the
 * replicas of the master it is on: a failover that lost it would reopen
 * the gap it closes. The standing record has no hash tag (its slot is the
 * digest's), and an abandon fails the batch before the receipts' WAITs, so
 * neither was covered by them. Each test watches, by MONITOR, the one
 * master that holds the write and no receipt of the batch's own writes.
 */
describe('cross-slot counts with WAIT on a Redis Cluster: the undo paths wait for their own masters', function () {
  this.timeout(120_000);
  const SHARDS = 16;
  let cluster: RedisCluster;
  let client: RedisClient;
  let masters: Array<{ port: number; ranges: Array<[number, number]> }>;

  before(async () => {
    cluster = await startRedisCluster({ masters: 3, replicasPerMaster: 1 });
    client = createRedisClient(cluster.seedUrls[0]!, 'test-cross-slot-wait', {}, 'cluster');
    client.on('error', () => {});
    masters = (await cluster.masters()).map((node) => ({
      port: node.port,
      ranges: node.slots.map((range) => {
        const [from, to] = range.split('-').map(Number);
        return [from!, to ?? from!] as [number, number];
      }),
    }));
  });
  after(async () => {
    client?.disconnect();
    await cluster?.stop();
  });

  const masterOf = (key: string): number => {
    const slot = keySlot(key);
    return masters.find((master) => master.ranges.some(([from, to]) => slot >= from && slot <= to))!.port;
  };
  /** Everything the master at `port` runs from now on, with the client address that sent it. */
  async function watch(port: number): Promise<{ seen: Array<{ args: string[]; source: string }>; settle(): Promise<void>; stop(): void }> {
    const monitor = await new Redis(port, '127.0.0.1').monitor();
    const seen: Array<{ args: string[]; source: string }> = [];
    // Command names as the client sent them: lower-cased here (ioredis sends 'hset', a `call` 'WAIT').
    monitor.on('monitor', (_time: string, [name, ...rest]: string[], source: string) => seen.push({ args: [name!.toLowerCase(), ...rest], source }));
    const direct = new Redis(port, '127.0.0.1');
    let fence = 0;
    while (masterOf(`fence-${fence}`) !== port) fence++;
    return {
      seen,
      // MONITOR streams in the order Redis ran: once our own GET shows, everything before it has.
      async settle() {
        await direct.get(`fence-${fence}`);
        for (let i = 0; i < 100 && !seen.some(({ args }) => args[0] === 'get' && args[1] === `fence-${fence}`); i++)
          await new Promise((r) => setTimeout(r, 50));
      },
      stop() {
        monitor.disconnect();
        direct.disconnect();
      },
    };
  }
  /** One message of two SKUs on two count shards (on two masters with apartMasters): 3 on A and 5 on B unless given. */
  function twoShardMessage(prefix: string, { apartMasters = false, deltas = [3, 5] }: { apartMasters?: boolean; deltas?: [number, number] } = {}) {
    const skus = Array.from({ length: 400 }, (_, i) => `sku-${i}`);
    const skuA = skus[0]!;
    const where = (sku: string) => (apartMasters ? masterOf(`{${shardOf(sku, SHARDS)}}`) : shardOf(sku, SHARDS));
    const skuB = skus.find((sku) => where(sku) !== where(skuA))!;
    const [shardA, shardB] = [shardOf(skuA, SHARDS), shardOf(skuB, SHARDS)];
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      ids: [`${prefix}m0`],
      changes: [
        [
          [skuA, deltas[0]],
          [skuB, deltas[1]],
        ],
      ],
    };
    return { task, skuA, skuB, shardA, shardB, keyA: countKey(prefix, shardA, skuA), keyB: countKey(prefix, shardB, skuB) };
  }
  /** One message's counts written across slots with WAIT 1, each step run through `untilDone`. */
  const writeWithWait = (prefix: string, task: BatchTask, untilDone: CrossSlotDeps['untilDone']) =>
    writeCountsAcrossSlots({
      redis: client,
      settings: testWorkerSettings({ redisUrl: cluster.seedUrls[0]!, prefix, virtualShards: SHARDS, waitReplicas: 1, waitTimeoutMs: 5000 }),
      task,
      groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW), SHARDS),
      writeCounts: WRITE_COUNTS,
      log: { warn() {}, error() {} },
      untilDone,
    });
  /** True when a WAIT came after the first command `matches` picked, on the same connection. */
  const waitedAfter = (seen: ReadonlyArray<{ args: string[]; source: string }>, matches: (args: string[]) => boolean): boolean => {
    const at = seen.findIndex(({ args }) => matches(args));
    expect(at, 'the write reached the watched master').to.be.at.least(0);
    return seen.slice(at + 1).some(({ args, source }) => args[0] === 'wait' && source === seen[at]!.source);
  };

  it("WAITs for a refused message's standing record on the master of its own slot", async () => {
    const prefix = `test:standing-wait:${randomUUID()}:`;
    const skus = Array.from({ length: 400 }, (_, i) => `sku-${i}`);
    const refusedSku = skus[0]!;
    const [changingSku, undoneSku] = skus.filter(
      (sku) => shardOf(sku, SHARDS) !== shardOf(refusedSku, SHARDS) && shardOf(sku, SHARDS) === shardOf(skus[1]!, SHARDS),
    );
    const [refusedShard, undoneShard] = [shardOf(refusedSku, SHARDS), shardOf(changingSku!, SHARDS)];
    const receiptMasters = new Set([masterOf(`{${refusedShard}}`), masterOf(`{${undoneShard}}`)]);
    // A message whose standing record sits on a master none of the batch's receipts is on.
    let n = 0;
    const recordOf = (id: string) => standingKey(prefix, markerDigest(id).toString('hex'));
    while (receiptMasters.has(masterOf(recordOf(`${prefix}m${n}`)))) n++;
    const id = `${prefix}m${n}`;
    const changingKey = countKey(prefix, undoneShard, changingSku!);
    await client.set(countKey(prefix, refusedShard, refusedSku), 'a foreign value');
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      ids: [id],
      changes: [
        [
          [refusedSku, 3],
          [changingSku!, 5],
          [undoneSku!, 7],
        ],
      ],
    };
    const watched = await watch(masterOf(recordOf(id)));
    try {
      // The written key turns foreign before its undo, so the undo is refused and its increment stands.
      const result = await writeWithWait(prefix, task, async (_step, run) => {
        if ((await client.get(changingKey)) === '5') await client.set(changingKey, 'changed by hand');
        return run();
      });
      expect(result.refusals[0]?.standing, 'the increment stands').to.deep.equal({ [changingKey]: '5' });
      expect(await client.hgetall(recordOf(id))).to.deep.equal({ [changingKey]: '5' });
      await watched.settle();
      expect(
        waitedAfter(watched.seen, (args) => args[0] === 'eval' && args.includes(recordOf(id))),
        'a WAIT after the record, on its master',
      ).to.equal(true);
    } finally {
      watched.stop();
    }
  });

  it("keeps the receipts alive while a standing record's WAIT waits long on another master: no shard is written twice", async () => {
    // Waited one after the other, the record's WAIT (its master's replica stopped for 2.5 TTLs) let the receipts on
    // the other masters expire; their WAITs then read them as lost to a failover and wrote their counts again.
    const prefix = `test:standing-long-wait:${randomUUID()}:`;
    const recordOf = (id: string) => standingKey(prefix, markerDigest(id).toString('hex'));
    const skus = Array.from({ length: 400 }, (_, i) => `sku-${i}`);
    const refusedSku = skus[0]!;
    const changingSku = skus.find((sku) => shardOf(sku, SHARDS) !== shardOf(refusedSku, SHARDS))!;
    const recordMaster = masterOf(recordOf(`${prefix}m0`));
    const busyShards = [shardOf(refusedSku, SHARDS), shardOf(changingSku, SHARDS)];
    const otherSku = skus.find((sku) => masterOf(`{${shardOf(sku, SHARDS)}}`) !== recordMaster && !busyShards.includes(shardOf(sku, SHARDS)))!;
    const changingKey = countKey(prefix, shardOf(changingSku, SHARDS), changingSku);
    const otherKey = countKey(prefix, shardOf(otherSku, SHARDS), otherSku);
    await client.set(countKey(prefix, shardOf(refusedSku, SHARDS), refusedSku), 'a foreign value');
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      ids: [`${prefix}m0`, `${prefix}m1`],
      changes: [
        [
          [refusedSku, 3],
          [changingSku, 5],
        ],
        [[otherSku, 11]],
      ],
    };
    const replica = (await cluster.replicas()).find((node) => node.masterPort === recordMaster)!;
    const rewrites: string[] = [];
    let stopped = false;
    try {
      const result = await writeCountsAcrossSlots({
        redis: client,
        settings: testWorkerSettings({ redisUrl: cluster.seedUrls[0]!, prefix, virtualShards: SHARDS, waitReplicas: 1, waitTimeoutMs: 300, markerTtlS: 2 }),
        task,
        groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW, PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log: { warn: (_fields, message) => (message.includes('writing its counts again') ? rewrites.push(message) : undefined), error() {} },
        untilDone: async (_step, run) => {
          // Just before the undo: the key turns foreign (so the record is written), and the record's replica stops.
          if (!stopped && (await client.get(changingKey)) === '5') {
            stopped = true;
            await client.set(changingKey, 'changed by hand');
            process.kill(replica.pid, 'SIGSTOP');
            setTimeout(() => process.kill(replica.pid, 'SIGCONT'), 5_000);
          }
          return run();
        },
      });
      expect(stopped, 'the scenario ran').to.equal(true);
      expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
      expect(rewrites, 'no receipt read as lost').to.deep.equal([]);
      expect(await client.get(otherKey), 'the other message counted once').to.equal('11');
      expect(await client.hgetall(recordOf(`${prefix}m0`))).to.deep.equal({ [changingKey]: '5' });
    } finally {
      if (stopped) process.kill(replica.pid, 'SIGCONT');
    }
  });

  it('a lost receipt written again with a part Redis now refuses: the batch reruns under its id and undoes it elsewhere', async () => {
    // Before, the rewrite's refusals were dropped: the marker would be occupied with the part counted on one shard only.
    const prefix = `test:rewrite-refused:${randomUUID()}:`;
    const { task, shardA, keyA, keyB } = twoShardMessage(prefix);
    // Both shards written; then, as a failover would leave it, shard A has lost its receipt and its count, and its key
    // has turned foreign: the WAIT finds the receipt gone and writes A again, which Redis refuses.
    let written = 0;
    const failure = await writeWithWait(prefix, task, async (step, run) => {
      const reply = await run();
      if (step === 'write_counts' && ++written === 2) {
        await client.del(receiptKey(prefix, shardA, task.batchId));
        await client.set(keyA, 'a foreign value');
      }
      return reply;
    }).then(
      () => null,
      (error: Error) => error,
    );
    expect(failure, 'the batch fails to be rerun').to.be.instanceOf(BatchWritesLostError);
    expect(classifyError(failure), 'a rerun under the same id, not an isolation that writes shard B again').to.not.equal('data');
    expect(await client.get(keyB), 'shard B still written').to.equal('5');

    const rerun = await writeWithWait(prefix, task, (_step, run) => run());
    expect(
      rerun.refusals.map((refusal) => refusal.part),
      'the rerun reads the refusal from the receipt',
    ).to.deep.equal([0]);
    expect(Number((await client.get(keyB)) ?? 0), "the refused message's count on shard B taken back").to.equal(0);
  });

  it('keeps the written receipts alive while another shard retries past their TTL: none is read as lost and written twice', async () => {
    const prefix = `test:receipts-alive:${randomUUID()}:`;
    const { task, keyA, keyB } = twoShardMessage(prefix);
    const rewrites: string[] = [];
    let writes = 0;
    const result = await writeCountsAcrossSlots({
      redis: client,
      settings: testWorkerSettings({ redisUrl: cluster.seedUrls[0]!, prefix, virtualShards: SHARDS, waitReplicas: 1, waitTimeoutMs: 1000, markerTtlS: 2 }),
      task,
      groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW), SHARDS),
      writeCounts: WRITE_COUNTS,
      log: { warn: (_fields, message) => (message.includes('writing its counts again') ? rewrites.push(message) : undefined), error() {} },
      untilDone: async (step, run) => {
        // The second shard's write retries for twice the receipts' TTL (an OOM master, say) before it lands.
        if (step === 'write_counts' && ++writes === 2) await new Promise((resolve) => setTimeout(resolve, 4_000));
        return run();
      },
    });
    expect(result.wrote).to.equal(true);
    expect(rewrites, 'no receipt read as lost').to.deep.equal([]);
    expect([await client.get(keyA), await client.get(keyB)], 'each shard counted once').to.deep.equal(['3', '5']);
  });

  it("stops the batch's other WAITs when one fails: none waits on for a batch its rerun waits for again", async () => {
    // Before, Promise.all rejected and the other loops went on, touching and logging, each rerun adding its own.
    const prefix = `test:wait-stops:${randomUUID()}:`;
    const { task, skuA, shardA, shardB } = twoShardMessage(prefix, { apartMasters: true });
    const replicaB = (await cluster.replicas()).find((node) => node.masterPort === masterOf(`{${shardB}}`))!;
    const timeouts: number[] = [];
    let written = 0;
    let stopped = false;
    try {
      const failure = await writeCountsAcrossSlots({
        redis: client,
        settings: testWorkerSettings({ redisUrl: cluster.seedUrls[0]!, prefix, virtualShards: SHARDS, waitReplicas: 1, waitTimeoutMs: 200 }),
        task,
        groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log: { warn: (_fields, message) => (message.includes('did not acknowledge') ? timeouts.push(Date.now()) : undefined), error() {} },
        untilDone: async (step, run) => {
          const reply = await run();
          if (step === 'write_counts' && ++written === 2) {
            // Shard B's WAIT cannot be met (its replica stopped); shard A's fails (its receipt lost, its rewrite refused).
            process.kill(replicaB.pid, 'SIGSTOP');
            stopped = true;
            await client.del(receiptKey(prefix, shardA, task.batchId));
            await client.set(countKey(prefix, shardA, skuA), 'a foreign value');
          }
          return reply;
        },
      }).then(
        () => null,
        (error: Error) => error,
      );
      expect(failure).to.be.instanceOf(BatchWritesLostError);
      const atFailure = timeouts.length;
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      expect(timeouts.length - atFailure, "shard B's WAIT stops after the one in flight").to.be.at.most(1);
    } finally {
      if (stopped) process.kill(replicaB.pid, 'SIGCONT');
    }
  });

  it("WAITs for an abandon's take-back on the master that took back, before the batch fails", async () => {
    const prefix = `test:abandon-wait:${randomUUID()}:`;
    // Shard A (written, then taken back) and shard B (its receipt of a foreign type) on different masters.
    const { task, skuA, shardA, shardB } = twoShardMessage(prefix, { apartMasters: true, deltas: [4, 1] });
    await client.hset(receiptKey(prefix, shardB, task.batchId), 'foreign', '1');
    const abandonReceipt = receiptKey(prefix, shardA, takeBackReceiptId(task.batchId, 0));
    const watched = await watch(masterOf(abandonReceipt));
    try {
      const failure = await writeWithWait(prefix, task, (_step, run) => run()).then(
        () => null,
        (error: Error) => error,
      );
      expect(failure?.message, 'the data failure still reaches batch isolation').to.match(/WRONGTYPE/);
      expect(Number((await client.get(countKey(prefix, shardA, skuA))) ?? 0), 'taken back').to.equal(0);
      await watched.settle();
      expect(
        waitedAfter(watched.seen, (args) => args[0] === 'evalsha' && args.includes(abandonReceipt)),
        'a WAIT after the take-back, on its master',
      ).to.equal(true);
    } finally {
      watched.stop();
    }
  });

  /** `count` distinct count shards, with two SKUs on each. */
  function shardsWithTwoSkus(count: number): Array<{ shard: number; skus: [string, string] }> {
    const byShard = new Map<number, string[]>();
    for (const sku of Array.from({ length: 400 }, (_, i) => `sku-${i}`)) byShard.set(shardOf(sku, SHARDS), [...(byShard.get(shardOf(sku, SHARDS)) ?? []), sku]);
    return [...byShard]
      .filter(([, skus]) => skus.length >= 2)
      .slice(0, count)
      .map(([shard, [first, second]]) => ({ shard, skus: [first!, second!] }));
  }
  /** A batch of several messages (every part new) written across slots with WAIT 1, each step run through `untilDone`. */
  const writeBatchWithWait = (prefix: string, task: BatchTask, untilDone: CrossSlotDeps['untilDone']) =>
    writeCountsAcrossSlots({
      redis: client,
      settings: testWorkerSettings({ redisUrl: cluster.seedUrls[0]!, prefix, virtualShards: SHARDS, waitReplicas: 1, waitTimeoutMs: 5000 }),
      task,
      groups: groupByCountShard(task.changes, new Uint8Array(task.changes.length).fill(PART_NEW), SHARDS),
      writeCounts: WRITE_COUNTS,
      log: { warn() {}, error() {} },
      untilDone,
    });
  const count = async (key: string): Promise<number> => Number((await client.get(key)) ?? 0);
  /** A step that writes counts: a shard's write, or its take-backs. */
  const countsStep = (step: string): boolean => step === 'write_counts' || step === 'take_back_counts';

  it('a receipt lost with the foreign key that refused its part: the rewrite counts nothing there, the rerun nothing twice', async () => {
    // Before, the rewrite wrote the shard's whole sums again: the refused part, dead-lettered, counted 3 on A.
    const prefix = `test:rewrite-lost-refusal:${randomUUID()}:`;
    const { task, shardA, shardB, keyA, keyB } = twoShardMessage(prefix);
    const receiptA = receiptKey(prefix, shardA, task.batchId);
    await client.set(keyA, 'a foreign value');
    // Part 0 refused on A, counted on B, then undone there; then a failover loses A's receipt and the foreign key with it.
    let lost = false;
    const outcome = await writeWithWait(prefix, task, async (step, run) => {
      const reply = await run();
      if (countsStep(step) && !lost && (await client.exists(receiptKey(prefix, shardB, task.batchId))) === 1 && (await count(keyB)) === 0) {
        lost = true;
        await client.del(receiptA);
        await client.del(keyA);
      }
      return reply;
    }).then(
      (result) => result,
      (error: Error) => error,
    );
    expect(lost, 'the scenario ran').to.equal(true);
    expect(await client.get(keyA), 'the refused part not counted on A by the rewrite').to.equal(null);
    if (outcome instanceof Error) expect(outcome, 'if the batch fails, it is to be rerun').to.be.instanceOf(BatchWritesLostError);
    const result = outcome instanceof Error ? await writeWithWait(prefix, task, (_step, run) => run()) : outcome;
    expect(
      result.refusals.map((refusal) => refusal.part),
      'the message is refused',
    ).to.deep.equal([0]);
    expect(await count(keyB), 'undone on B').to.equal(0);
    expect(await client.exists(receiptA), "A's receipt written again").to.equal(1);

    // A rerun under the id (a replay of the dead letter must find nothing of the message standing).
    const rerun = await writeWithWait(prefix, task, (_step, run) => run());
    expect(
      rerun.refusals.map((refusal) => refusal.part),
      "the refusal read from A's new receipt",
    ).to.deep.equal([0]);
    expect([await count(keyA), await count(keyB)], 'nothing counted on either shard').to.deep.equal([0, 0]);
  });

  it('a rewrite that finds refused a part the first run counted: the rerun takes it back on the other shard', async () => {
    // Before, shard B's one `~undo` receipt, written for part 1, made the rerun skip part 0's undo: b1 stood, counted twice on replay.
    const prefix = `test:rewrite-newly-refused:${randomUUID()}:`;
    const [A, B] = shardsWithTwoSkus(2);
    const [a1, a2] = A!.skus;
    const [b1, b2] = B!.skus;
    const [keyA1, keyA2, keyB1, keyB2] = [
      countKey(prefix, A!.shard, a1),
      countKey(prefix, A!.shard, a2),
      countKey(prefix, B!.shard, b1),
      countKey(prefix, B!.shard, b2),
    ];
    const task = batchOf(
      prefix,
      [
        [a1, 3],
        [b1, 5],
      ],
      [
        [a2, 7],
        [b2, 11],
      ],
    );
    await client.set(keyA2, 'a foreign value');
    // Part 1 refused on A and undone on B; then a failover loses A's write (receipt and a1's count), and a1 turns foreign.
    let lost = false;
    const failure = await writeBatchWithWait(prefix, task, async (step, run) => {
      const reply = await run();
      if (countsStep(step) && !lost && (await client.exists(receiptKey(prefix, B!.shard, task.batchId))) === 1 && (await count(keyB2)) === 0) {
        lost = true;
        await client.del(receiptKey(prefix, A!.shard, task.batchId));
        await client.set(keyA1, 'a foreign value');
      }
      return reply;
    }).then(
      () => null,
      (error: Error) => error,
    );
    expect(lost, 'the scenario ran').to.equal(true);
    expect(failure, 'the rewrite finds part 0 refused: the batch is rerun').to.be.instanceOf(BatchWritesLostError);

    const rerun = await writeBatchWithWait(prefix, task, (_step, run) => run());
    expect(rerun.refusals.map((refusal) => refusal.part).sort(), 'both messages refused').to.deep.equal([0, 1]);
    expect([await count(keyB1), await count(keyB2)], 'both parts taken back on B, each once').to.deep.equal([0, 0]);
    await writeBatchWithWait(prefix, task, (_step, run) => run());
    expect([await count(keyB1), await count(keyB2)], 'a second rerun takes back nothing twice').to.deep.equal([0, 0]);
    expect([await client.get(keyA1), await client.get(keyA2)]).to.deep.equal(['a foreign value', 'a foreign value']);
  });

  it('a lost receipt turned foreign before its rewrite: the rerun abandons the batch, taking back each part once', async () => {
    // Before, the abandon's `~abandon` receipt did not know part 1 was already undone on B: taken back twice, b2 = -11.
    const prefix = `test:rewrite-foreign-receipt:${randomUUID()}:`;
    const [A, B, C] = shardsWithTwoSkus(3);
    const [a1] = A!.skus;
    const [b1, b2] = B!.skus;
    const [c1] = C!.skus;
    const [keyA1, keyB1, keyB2, keyC1] = [
      countKey(prefix, A!.shard, a1),
      countKey(prefix, B!.shard, b1),
      countKey(prefix, B!.shard, b2),
      countKey(prefix, C!.shard, c1),
    ];
    const task = batchOf(
      prefix,
      [
        [a1, 3],
        [b1, 5],
      ],
      [
        [c1, 7],
        [b2, 11],
      ],
    );
    const receiptA = receiptKey(prefix, A!.shard, task.batchId);
    await client.set(keyC1, 'a foreign value');
    // Part 1 refused on C and undone on B; then a failover loses A's receipt (and a1's count), and the receipt's key turns
    // foreign after the touch found it missing, just before the rewrite: the rewrite is refused for its data.
    let phase: 'writing' | 'lost' | 'rewriting' = 'writing';
    const failure = await writeBatchWithWait(prefix, task, async (step, run) => {
      if (step === 'write_counts' && phase === 'lost') {
        phase = 'rewriting';
        await client.hset(receiptA, 'foreign', '1');
      }
      const reply = await run();
      if (countsStep(step) && phase === 'writing' && (await client.exists(receiptKey(prefix, B!.shard, task.batchId))) === 1 && (await count(keyB2)) === 0) {
        phase = 'lost';
        await client.del(receiptA);
        await client.del(keyA1);
      }
      return reply;
    }).then(
      () => null,
      (error: Error) => error,
    );
    expect(phase, 'the scenario ran').to.equal('rewriting');
    expect(failure, 'the rewrite refused for its data: the batch is rerun under its id').to.be.instanceOf(BatchWritesLostError);

    const rerun = await writeBatchWithWait(prefix, task, (_step, run) => run()).then(
      () => null,
      (error: Error) => error,
    );
    expect(rerun?.message, "the rerun fails for A's receipt").to.match(/WRONGTYPE/);
    expect(classifyError(rerun), 'and reaches batch isolation').to.equal('data');
    expect([await count(keyB1), await count(keyB2)], 'what B wrote taken back, each part once').to.deep.equal([0, 0]);
    expect(await client.get(keyA1), 'lost with the receipt, not written again').to.equal(null);
    expect(await client.get(keyC1)).to.equal('a foreign value');
  });

  const takeBackRetries = [
    {
      title: "keeps a take-back's receipt alive while a sibling take-back retries past its TTL: no part is taken back twice",
      // Before, only the write receipts were kept alive: B's expired while C's take-back retried, the WAIT read it as
      // lost to a failover, and the rerun took part 0 back on B again (b = -5).
      secondTakeBack: async (run: () => Promise<unknown>) => {
        await new Promise((resolve) => setTimeout(resolve, 4_000));
        return run();
      },
    },
    {
      title: "keeps a take-back's receipt alive from its first attempt: one that landed with its reply lost is not taken back twice",
      // Before, a receipt was kept alive once its step answered: C's landed, its reply was lost, and the retries were
      // refused past its TTL (an OOM master, say): the next attempt took part 0 back on C again (c = -7).
      secondTakeBack: async (run: () => Promise<unknown>) => {
        await run();
        await new Promise((resolve) => setTimeout(resolve, 4_000));
        return run();
      },
    },
  ];
  for (const { title, secondTakeBack } of takeBackRetries)
    it(title, async () => {
      const prefix = `test:take-backs-alive:${randomUUID()}:`;
      const [A, B, C] = shardsWithTwoSkus(3);
      const [a, b, c] = [A!.skus[0], B!.skus[0], C!.skus[0]];
      const [keyA, keyB, keyC] = [countKey(prefix, A!.shard, a), countKey(prefix, B!.shard, b), countKey(prefix, C!.shard, c)];
      const task = batchOf(prefix, [
        [a, 3],
        [b, 5],
        [c, 7],
      ]);
      await client.set(keyA, 'a foreign value');
      let takeBacks = 0;
      const result = await writeCountsAcrossSlots({
        redis: client,
        settings: testWorkerSettings({ redisUrl: cluster.seedUrls[0]!, prefix, virtualShards: SHARDS, waitReplicas: 1, waitTimeoutMs: 1000, markerTtlS: 2 }),
        task,
        groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log: { warn() {}, error() {} },
        untilDone: async (step, run) => {
          // The take-backs on B and C, one call each: the second one's attempts take twice the receipts' TTL.
          if (step === 'take_back_counts' && ++takeBacks === 2) return secondTakeBack(run) as ReturnType<typeof run>;
          return run();
        },
      });
      expect(takeBacks, 'the scenario ran').to.equal(2);
      expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
      expect([await count(keyB), await count(keyC)], 'taken back once on each shard').to.deep.equal([0, 0]);
    });
});
