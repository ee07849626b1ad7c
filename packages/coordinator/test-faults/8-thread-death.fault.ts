import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, countsOf, statsOf, testSpace, AMQP_URL } from '../test/integration/harness.js';
import { checkCounts, checkDeadLetters, unitsPerMessage } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

/**
 * A worker thread that dies after its count write and before
 * its markers (two-step), or after its script and before its reply (atomic).
 * The thread really dies: TALLY_FAULT_THREAD_EXIT_AFTER_WRITE makes each
 * thread call process.exit() inside itself after its n-th count write;
 * piscina fails the thread's batches in flight and starts a new thread. The
 * coordinator reruns each failed batch under the batch id it made, so the
 * rerun finds the write receipt and the counts stay exact: no overcount at
 * all, in both modes (a batch id made in the thread gave every rerun a new
 * receipt and wrote the counts twice).
 */
describe('faults: worker threads killed inside the window', function () {
  this.timeout(300_000);

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: threads that die after their count write lose nothing and count nothing twice`, async () => {
      const virtualShards = 16;
      const exitAfterWrites = 40;
      const space = testSpace(`f-thread-${mode}`, {
        TALLY_MODE: mode,
        TALLY_WORKERS: '2',
        TALLY_BATCH_SIZE: '100',
        TALLY_FAULT_THREAD_EXIT_AFTER_WRITE: String(exitAfterWrites),
      });
      const fleet = new DaemonFleet();
      const shape = { maxChanges: 4, maxDelta: 9 };
      try {
        const workload = generateWorkload({ messages: 30_000, skus: 2_000, seed: 61, duplicateRate: 0.02, badRate: 0.002, idPrefix: space.queue, ...shape });
        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
        await fleet.drain(space.env, space.queue);

        const reruns = fleet.logs.filter((l) => l.includes('batch failed in its worker thread') && l.includes('worker exited')).length;
        const check = checkCounts(await countsOf(space.prefix, virtualShards), workload.truth, virtualShards);
        const stats = await statsOf(space.prefix);
        const units = unitsPerMessage(workload.truth, workload.good, shape.maxChanges, shape.maxDelta);
        const dead = await checkDeadLetters(
          space.queue,
          workload.publishes.filter((p) => p.kind === 'bad').map((p) => ({ body: p.body, messageId: p.messageId, codes: new Set([p.reason!]) })),
        );
        // Each thread's death fails every batch it had in flight; the kills
        // column counts deaths, seen as the distinct "worker exited" failures
        // logged by the coordinator (one per thread death).
        const deaths = fleet.logs.filter((l) => l.includes('fault injection: worker thread exits')).length;
        rows.push({
          scenario: `worker thread killed in the window (${mode})`,
          messages: workload.publishes.length,
          kills: deaths,
          lost: check.lostUnits,
          overcount: check.overcountUnits,
          bound: 0,
          estimate: 0,
          note: `each thread exits after ${exitAfterWrites} count writes; ${reruns} batches rerun under their own ids; mean ${units.mean.toFixed(1)} units/msg`,
        });
        console.log(`      ${mode}: ${deaths} thread deaths, ${reruns} batch reruns; stats ${JSON.stringify(stats)}`);

        expect(fleet.violations, 'the daemon itself never died').to.deep.equal([]);
        expect(reruns, 'threads died with batches in flight, and those batches were rerun').to.be.greaterThan(0);
        expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
        expect(check.overcountUnits, 'a rerun finds its receipt: nothing counted twice').to.equal(0);
        expect(dead.missing).to.equal(0);
        expect(dead.foreign).to.equal(0);
        expect(dead.wrongReasons).to.deep.equal([]);
      } finally {
        await fleet.killAll();
        await cleanup(space);
      }
    });
  }
});
