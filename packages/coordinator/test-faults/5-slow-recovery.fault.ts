import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll, seededRandom } from '@tally/workload';
import { cleanup, countsOf, queueState, statsOf, testSpace, waitForReadyBelow, AMQP_URL } from '../test/integration/harness.js';
import { checkCounts, checkDeadLetters, deviationFromCli, overcountBound, unitsPerMessage } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

describe('faults: recovery slower than the marker TTL', function () {
  this.timeout(300_000);

  it('re-counts what was occupied but not acked, as much as `tally deviation` predicts (within a factor of 2)', async () => {
    const config = { mode: 'two-step' as const, virtualShards: 16, batchSize: 100, prefetch: 2000, markerTtlS: 2 };
    const space = testSpace('f-slow', { TALLY_MARKER_TTL_S: String(config.markerTtlS), TALLY_BATCH_SIZE: String(config.batchSize) });
    const fleet = new DaemonFleet();
    const shape = { maxChanges: 4, maxDelta: 9 };
    const random = seededRandom(11);
    const restartDelayMs = 3_500; // past the 2 s TTL (plus startup): every marker of the victim has expired
    try {
      // Duplicate publishes right after their original only: a copy published
      // far apart would outlive the 2 s TTL by itself and be counted again
      // without any crash, which is not what this scenario measures.
      // Ten crashes: the exposure at one instant swings widely (acks come in
      // waves), so fewer would not average out reliably.
      const kills = 10;
      const perRound = 40_000;
      const workload = generateWorkload({ messages: kills * perRound, skus: 2_000, seed: 91, duplicateRate: 0.02, nearDuplicateShare: 1, idPrefix: space.queue, ...shape });
      // The estimator divides by busy time: it describes a crash under load.
      // So each victim gets a fresh backlog and dies at a uniformly random
      // point of it, by progress rather than by the clock (the daemon's speed
      // varies several-fold between a quiet and a busy machine): once 25% to
      // 65% of its backlog is consumed, past the first wave of completions
      // that follows a start (which holds far more finished-but-unacked
      // deliveries than steady state). A victim found idle at its death fails
      // the test rather than quietly measuring nothing.
      let longestRecoveryMs = 0;
      let idleKills = 0;
      const chunk = Math.ceil(workload.publishes.length / kills);
      for (let k = 0; k < kills; k++) {
        await publishAll(workload.publishes.slice(k * chunk, (k + 1) * chunk), { url: AMQP_URL, queue: space.queue });
        const backlog = (await queueState(space.queue)).messageCount;
        const daemon = await fleet.start(space.env);
        await waitForReadyBelow(space.queue, Math.floor(backlog * (0.75 - random() * 0.4)));
        await fleet.kill(daemon);
        const down = performance.now();
        if ((await queueState(space.queue)).messageCount <= config.prefetch) idleKills++;
        await sleep(restartDelayMs);
        if (k < kills - 1) longestRecoveryMs = Math.max(longestRecoveryMs, performance.now() - down + 1_000);
      }
      await fleet.drain(space.env, space.queue);
      longestRecoveryMs = Math.max(longestRecoveryMs, restartDelayMs + 2_000);

      const check = checkCounts(await countsOf(space.prefix, config.virtualShards), workload.truth, config.virtualShards);
      const stats = await statsOf(space.prefix);
      const units = unitsPerMessage(workload.truth, workload.good, shape.maxChanges, shape.maxDelta);
      const bound = overcountBound(config, 0, kills, units.max);
      // The estimator as an operator runs it: the CLI, with this run's kills
      // as the crashes and its restart delays as the recovery distribution.
      const estimate = await deviationFromCli(space.env, kills, `min=${restartDelayMs / 1000}s,max=${Math.ceil(longestRecoveryMs / 1000)}s`);
      const estimatedUnits = estimate.expectedPerMonth * units.mean;
      const measuredMessages = check.overcountUnits / units.mean;
      const dead = await checkDeadLetters(space.queue, []);
      rows.push({
        scenario: 'recovery slower than the TTL',
        messages: workload.publishes.length,
        kills,
        lost: check.lostUnits,
        overcount: check.overcountUnits,
        bound,
        estimate: estimatedUnits,
        note: `TTL ${config.markerTtlS} s, restart after ${restartDelayMs / 1000} s; measured ${measuredMessages.toFixed(0)} msgs, estimated ${estimate.expectedPerMonth.toFixed(0)} (W ${estimate.perCrash.window.toFixed(1)} + U ${estimate.perCrash.occupiedUnacked.toFixed(0)} per crash)`,
      });
      console.log(`      stats ${JSON.stringify(stats)}`);
      console.log(`      measured ${check.overcountUnits} units = ${measuredMessages.toFixed(1)} messages; estimated ${estimate.expectedPerMonth.toFixed(1)} messages`);

      expect(fleet.violations, 'daemons that exited on their own').to.deep.equal([]);
      expect(idleKills, 'victims that had run out of backlog when killed').to.equal(0);
      expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
      expect(estimate.slowShare.expected, 'every recovery outlasted the TTL').to.equal(1);
      expect(check.overcountUnits, 'the slow recoveries did re-count').to.be.greaterThan(0);
      expect(check.overcountUnits).to.be.at.most(bound);
      expect(stats.redelivered_unmarked + stats.partial_duplicates, 'the re-count is visible in the counters').to.be.greaterThan(0);
      const ratio = check.overcountUnits / estimatedUnits;
      expect(ratio, `measured / estimated = ${ratio.toFixed(2)}`).to.be.within(0.5, 2);
      expect(dead.deadLettered, 'no bad message was published').to.equal(0);
    } finally {
      await fleet.killAll();
      await cleanup(space);
    }
  });
});
