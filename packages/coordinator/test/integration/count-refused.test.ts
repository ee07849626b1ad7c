/**
 * A count Redis refuses, end to end: a count key holding a foreign value. Every
 * message with a change for it ends in `<queue>.dead` with `count-refused`
 * and the Redis error, the SKU, key and delta in x-tally-reason; the part of
 * it in the poisoned key's shard counts nothing, its other parts are counted;
 * everything else is counted exactly and the stream goes on. After the key is
 * repaired, `tally dead replay --reason count-refused` counts the refused
 * parts exactly once (the other parts are skipped by their markers).
 */
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { generateWorkload, publishAll } from '@tally/workload';
import { countKey, shardOf } from '@tally/shared';
import type { ReplayReport } from '../../src/commands/dead-queue.js';
import {
  pinMarkerScope,
  cleanup,
  compare,
  countsOf,
  drainQueue,
  drainWithDaemon,
  queueState,
  statsOf,
  testSpace,
  AMQP_URL,
  CLI,
  REDIS_URL,
} from './harness.js';
import { runTool } from './ops-tools.js';

interface Body {
  id: string;
  changes: Array<{ sku: string; delta: number }>;
}

describe('count refused: a foreign value in a count key (integration, both modes)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(240_000);

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: refused messages are dead-lettered count-refused, the rest counted exactly; a replay after the repair counts them once`, async () => {
      const virtualShards = 16;
      const space = testSpace(`refused-${mode}`, { TALLY_MODE: mode, TALLY_BATCH_WAIT_MS: '10' });
      const redis = new Redis(REDIS_URL);
      try {
        const workload = generateWorkload({ messages: 800, skus: 80, seed: 33, duplicateRate: 0, badRate: 0, idInPropertyShare: 0, idPrefix: space.queue });
        const poisoned = 'SKU-000007';
        const poisonShard = shardOf(poisoned, virtualShards);
        const poisonKey = countKey(space.prefix, poisonShard, poisoned);
        await redis.set(poisonKey, 'abc');

        const bodies = workload.publishes.map((p) => JSON.parse(p.body.toString()) as Body);
        const refused = bodies.filter((b) => b.changes.some((c) => c.sku === poisoned && c.delta !== 0));
        expect(refused.length, 'the workload hits the poisoned SKU').to.be.greaterThan(10);
        // Before the replay: a refused message's part in the poisoned shard counts nothing, its other parts count.
        const before = new Map(workload.truth);
        for (const body of refused) {
          for (const { sku, delta } of body.changes) {
            if (shardOf(sku, virtualShards) === poisonShard) before.set(sku, (before.get(sku) ?? 0) - delta);
          }
        }
        for (const [sku, n] of before) if (n === 0) before.delete(sku);

        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
        await drainWithDaemon(space.env, space.queue);

        expect(await redis.get(poisonKey), 'the foreign value is untouched').to.equal('abc');
        expect(await redis.ttl(poisonKey), 'and gets no TTL').to.equal(-1);
        const counts = await countsOf(space.prefix, virtualShards);
        counts.delete(poisoned); // 'abc' reads as NaN
        const first = compare(counts, before);
        expect(first.below, 'nothing else lost').to.deep.equal([]);
        expect([...first.excess], 'nothing counted twice').to.deep.equal([]);
        expect((await queueState(space.queue)).messageCount, 'the stream went on').to.equal(0);

        const stats = await statsOf(space.prefix);
        expect(stats.count_errors, 'one refused part per refused message').to.equal(refused.length);
        expect(stats.dead_lettered).to.equal(refused.length);

        // What an operator sees: tally dead list, by reason.
        const list = await runTool(process.execPath, [CLI, 'dead', 'list', '--json', '--limit', '100000'], { env: { ...process.env, ...space.env } });
        expect(list.code, list.stderr).to.equal(0);
        const report = JSON.parse(list.stdout) as { byReason: Record<string, number>; messages: Array<{ id?: string; reason: string; detail: string }> };
        expect(report.byReason).to.deep.equal({ 'count-refused': refused.length });
        expect(new Set(report.messages.map((m) => m.id))).to.deep.equal(new Set(refused.map((b) => b.id)));
        for (const message of report.messages) {
          expect(message.detail).to.match(/not an integer/);
          expect(message.detail).to.include(`"${poisoned}"`);
          expect(message.detail).to.include(poisonKey);
          expect(message.detail).to.match(/delta -?\d+/);
        }
        expect(report, 'Redis answered: no warning').to.not.have.property('standingRecordsUnread');
        // Redis down: the list goes on from the broker alone, and says what it could not read.
        const blind = await runTool(process.execPath, [CLI, 'dead', 'list', '--json', '--limit', '100000'], {
          env: { ...process.env, ...space.env, TALLY_REDIS_URL: 'redis://127.0.0.1:1' },
        });
        expect(blind.code, blind.stderr).to.equal(0);
        const blindReport = JSON.parse(blind.stdout) as { byReason: Record<string, number>; standingRecordsUnread?: string };
        expect(blindReport.byReason).to.deep.equal({ 'count-refused': refused.length });
        expect(blindReport.standingRecordsUnread, 'why Redis was not read').to.be.a('string').and.not.equal('');
        expect(blind.stderr).to.include('standing counts recorded in Redis not read');

        // The operator repairs the key and replays.
        await redis.del(poisonKey);
        const replay = await runTool(process.execPath, [CLI, 'dead', 'replay', '--reason', 'count-refused', '--json'], {
          env: { ...process.env, ...space.env },
        });
        expect(replay.code, replay.stderr).to.equal(0);
        expect((JSON.parse(replay.stdout) as ReplayReport).replayed).to.equal(refused.length);
        await drainWithDaemon(space.env, space.queue);

        const final = compare(await countsOf(space.prefix, virtualShards), workload.truth);
        expect(final.below, 'every refused part counted after the replay').to.deep.equal([]);
        expect([...final.excess], 'and the other parts of the replayed messages not again').to.deep.equal([]);
        expect(await drainQueue(`${space.queue}.dead`), 'nothing dead-lettered again').to.have.length(0);
      } finally {
        redis.disconnect();
        await cleanup(space);
      }
    });
  }
});
