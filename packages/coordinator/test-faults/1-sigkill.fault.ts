import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll, seededRandom } from '@tally/workload';
import { cleanup, countsOf, statsOf, testSpace, AMQP_URL } from '../test/integration/harness.js';
import { checkCounts, checkDeadLetters, estimateRun, overcountBound, unitsPerMessage } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

describe('faults: repeated SIGKILL', function () {
  this.timeout(300_000);

  it('loses nothing over 22 kills at random moments, and overcounts within one batch per shard per kill', async () => {
    const config = { mode: 'two-step' as const, virtualShards: 16, batchSize: 100, prefetch: 2000, markerTtlS: 600 };
    const space = testSpace('f-kill', { TALLY_BATCH_SIZE: String(config.batchSize)});
    const fleet = new DaemonFleet();
    const shape = { maxChanges: 4, maxDelta: 9 };
    const random = seededRandom(7);
    try {
      const workload = generateWorkload({ messages: 60_000, skus: 2_000, seed: 71, duplicateRate: 0.02, badRate: 0.004, idPrefix: space.queue, ...shape });
      // Published while the daemon is killed and restarted, so kills land on
      // every phase: startup, redelivery of the last victim's unacked window,
      // fresh batches being written.
      const publishing = publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const kills = 22;
      let longestDowntimeMs = 0;
      for (let k = 0; k < kills; k++) {
        const down = performance.now();
        const daemon = await fleet.start(space.env);
        longestDowntimeMs = Math.max(longestDowntimeMs, performance.now() - down);
        // Every fifth kill right after consuming starts (the redelivery burst); the others 50 to 900 ms in.
        await sleep(k % 5 === 0 ? 0 : 50 + random() * 850);
        await fleet.kill(daemon);
      }
      await publishing;
      await fleet.drain(space.env, space.queue);

      const check = checkCounts(await countsOf(space.prefix, config.virtualShards), workload.truth, config.virtualShards);
      const stats = await statsOf(space.prefix);
      const units = unitsPerMessage(workload.truth, workload.good, shape.maxChanges, shape.maxDelta);
      const bound = overcountBound(config, kills, 0, units.max);
      const estimate = estimateRun(stats, config, kills, `min=0s,max=${Math.ceil(longestDowntimeMs / 1000)}s`);
      const dead = await checkDeadLetters(
        space.queue,
        workload.publishes.filter((p) => p.kind === 'bad').map((p) => ({ body: p.body, messageId: p.messageId, codes: new Set([p.reason!]) })),
      );
      rows.push({
        scenario: 'repeated SIGKILL',
        messages: workload.publishes.length,
        kills,
        lost: check.lostUnits,
        overcount: check.overcountUnits,
        bound,
        estimate: estimate.expectedPerMonth * units.mean,
        note: `batch ${config.batchSize}; ${dead.repeats} dead-letter copies repeated after kills`,
      });
      console.log(`      stats ${JSON.stringify(stats)}`);

      expect(fleet.violations, 'daemons that exited on their own').to.deep.equal([]);
      expect(fleet.kills).to.equal(kills);
      expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
      expect(check.overcountUnits, 'overcount within kills × one batch per shard').to.be.at.most(bound);
      const perShard = kills * config.batchSize * units.max;
      for (const [vshard, excess] of check.excessPerShard.entries()) expect(excess, `excess of shard ${vshard}`).to.be.at.most(perShard);
      // Visible, never silent: an overcount comes with redeliveries that found no marker.
      if (check.overcountUnits > 0) expect(stats.redelivered_unmarked + stats.partial_duplicates).to.be.greaterThan(0);
      // (Counters of a killed daemon's last second are lost, so totals are not compared with the publishes.)
      expect(stats.redelivered_unmarked + stats.duplicates + stats.partial_duplicates, 'the broker redelivered what the victims held').to.be.greaterThan(0);
      expect(dead.missing, 'bad messages missing from the dead-letter queue').to.equal(0);
      expect(dead.foreign, 'dead-lettered messages that were not bad').to.equal(0);
      expect(dead.wrongReasons).to.deep.equal([]);
      expect(dead.withoutReason).to.equal(0);
    } finally {
      await fleet.killAll();
      await cleanup(space);
    }
  });
});
