import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, PART_DONE, PART_NEW, shardOf, type BatchTask } from '@tally/shared';
import { testWorkerSettings } from '@tally/testkit';
import type { BatchLog } from '../src/batch-log.js';
import { groupByCountShard, writeCountsAcrossSlots } from '../src/cross-slot-counts.js';
import { WRITE_COUNTS } from '../src/two-step-batch.js';

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

  it('leaves the counts standing, counts the parts and names each key and the delta to subtract', async () => {
    // Two SKUs on two count shards: the message is refused on the first, so its count on the second is undone.
    const refusedSku = 'sku-a';
    let standingSku = 'sku-b';
    for (let i = 0; shardOf(standingSku, SHARDS) === shardOf(refusedSku, SHARDS); i++) standingSku = `sku-b${i}`;
    const refusedKey = countKey(prefix, shardOf(refusedSku, SHARDS), refusedSku);
    const standingKey = countKey(prefix, shardOf(standingSku, SHARDS), standingSku);
    await redis.set(refusedKey, 'a foreign value');
    const task: BatchTask = {
      vshard: 0,
      batchId: randomUUID(),
      changes: [
        [
          [refusedSku, 3],
          [standingSku, 5],
        ],
      ],
    };
    // The key on the other shard turns foreign just as its undo arrives: the undo is refused whole.
    const client = new Redis(REDIS_URL);
    const turnsForeign = new Proxy(client, {
      get(target, property, receiver) {
        if (property !== 'call') return Reflect.get(target, property, receiver);
        return async (command: string, args: Array<string | number>) => {
          if (command === 'EVALSHA' && args.some((arg) => String(arg).endsWith('~undo'))) await redis.set(standingKey, 'changed by hand');
          return target.call(command, args);
        };
      },
    });
    const errors: Array<{ fields: Record<string, unknown>; message: string }> = [];
    const log: BatchLog = { warn() {}, error: (fields, message) => errors.push({ fields, message }) };
    const undoFailures: Array<{ shard: number; parts: number }> = [];
    try {
      const result = await writeCountsAcrossSlots({
        redis: turnsForeign,
        settings: testWorkerSettings({ redisUrl: REDIS_URL, prefix, virtualShards: SHARDS }),
        task,
        groups: groupByCountShard(task.changes, Uint8Array.of(PART_NEW), SHARDS),
        writeCounts: WRITE_COUNTS,
        log,
        untilDone: (_step, run) => run(),
        onUndoFailed: (_task, shard, parts) => undoFailures.push({ shard, parts }),
      });
      expect(result.refusals.map((refusal) => refusal.part)).to.deep.equal([0]);
      expect(undoFailures).to.deep.equal([{ shard: shardOf(standingSku, SHARDS), parts: 1 }]);
      expect(errors).to.have.length(1);
      expect(errors[0]!.fields.stand, 'each standing key with the delta that stands').to.deep.equal({ [standingKey]: '5' });
      expect(errors[0]!.message).to.include('subtract each delta');
      expect(await redis.get(refusedKey), 'the foreign key is never touched').to.equal('a foreign value');
    } finally {
      client.disconnect();
    }
  });
});
