/**
 * A batch that fails for its data, across the real thread boundary: the
 * worker thread classifies the Redis error where it still has its type and
 * the coordinator receives the class (a thrown ReplyError would arrive as a
 * plain Error); runIsolating then splits the batch down to the part that
 * fails and reports only that part refused. Real piscina threads, real Redis.
 */
import { randomBytes } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { ClassifiedFailure, countKey, encodeBatchTask, markerDigest, type PartChanges, type TallyMode, type WireParts } from '@tally/shared';
import { markerEntry, readMarkers, testWorkerSettings } from '@tally/testkit';
import { runIsolating } from '../../src/pipeline/batch-isolation.js';
import { WorkerPools } from '../../src/threads/worker-pools.js';
import { pinMarkerScope, REDIS_URL } from './harness.js';

describe('batch failure classes across the thread boundary (real threads, real Redis)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(60_000);

  for (const mode of ['two-step', 'atomic'] as const satisfies readonly TallyMode[]) {
    it(`${mode}: a data failure arrives classified 'data'; isolation refuses only the failing part and counts the rest`, async () => {
      const prefix = `t.isolate.${randomBytes(4).toString('hex')}:`;
      const pools = new WorkerPools(testWorkerSettings({ redisUrl: REDIS_URL, prefix, mode, countTtlS: 600 }), 1, 16);
      const redis = new Redis(REDIS_URL);
      try {
        // A delta of 1.5 never passes the parser; here it stands for any
        // argument Redis (two-step: INCRBY) or the script (atomic:
        // TALLY_SCRIPT_ARGS) refuses for the batch as a whole.
        const parts: Array<{ id: string; digest: Uint8Array; changes: PartChanges }> = Array.from({ length: 7 }, (_, i) => ({
          id: `${prefix}m${i}`,
          digest: markerDigest(`${prefix}m${i}`),
          changes: [[`S${i}`, i === 4 ? 1.5 : 10 + i]],
        }));
        const wireParts = (from: number, to: number): WireParts => ({
          count: to - from,
          digest: (i) => parts[from + i]!.digest,
          changes: (i) => parts[from + i]!.changes,
          messageParts: () => 1,
        });
        if (mode === 'atomic') {
          // The atomic script checks its arguments before any write and refuses the whole batch.
          let thrown: unknown = null;
          try {
            await pools.run(encodeBatchTask(2, `${prefix}whole`, wireParts(0, 7)));
          } catch (error) {
            thrown = error;
          }
          expect(thrown, 'the class crossed the thread boundary').to.be.instanceOf(ClassifiedFailure);
          expect((thrown as ClassifiedFailure).failureClass).to.equal('data');
          expect((thrown as Error).message).to.match(/^TALLY_SCRIPT_ARGS/);
        }

        const splits: Array<[number, number]> = [];
        const result = await runIsolating(
          2,
          7,
          `${prefix}b`,
          (id, from, to) => pools.run(encodeBatchTask(2, id, wireParts(from, to))),
          (_error, _id, from, to) => splits.push([from, to]),
        );
        expect(
          result.refusals.map((r) => r.part),
          'only the failing part is refused',
        ).to.deep.equal([4]);
        if (mode === 'atomic') expect(splits.at(-1), 'isolated down to that single part').to.deep.equal([4, 5]);
        // Two-step: INCRBY refuses "1.5" inside write_counts, which isolates the part itself: no split needed.
        else expect(splits, 'the script isolated it').to.deep.equal([]);
        expect([...result.marked]).to.deep.equal(new Array(7).fill(0));
        for (let i = 0; i < 7; i++) {
          expect(await redis.get(countKey(prefix, 2, `S${i}`)), `S${i}`).to.equal(i === 4 ? null : String(10 + i));
          expect((await readMarkers(redis, prefix)).done.has(markerEntry(2, parts[i]!.id)), `marker ${i}`).to.equal(i !== 4);
        }
      } finally {
        await pools.destroy();
        const keys = await redis.keys(`${prefix}*`);
        if (keys.length > 0) await redis.del(...keys);
        redis.disconnect();
      }
    });
  }
});
