import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll, seededRandom } from '@tally/workload';
import { cleanup, countsOf, queueState, statsOf, testSpace, waitForReadyBelow, withRedis, AMQP_URL } from '../test/integration/harness.js';
import { largestBatchUnits, partsById, unmarkedUnitsPerShard } from '../test/integration/crash-window.js';
import { checkCounts, checkDeadLetters, deviationFromCli, unitsPerMessage } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

/** A victim lives, once loaded, an exponentially distributed time of this mean: a few batch cycles. */
const MEAN_LIFE_MS = 1_000;
/**
 * A kill lands inside a window about one time in four, and then catches most
 * shards at once (the lanes start together after a restart), so the sum over
 * kills is lumpy: resampling the 90 kills of three runs puts the
 * measured/estimated ratio outside 0.5..2 in about 15% of 30-kill runs even
 * with an exact estimate (22% with 22 kills; 60 kills would still leave 5%).
 */
const KILLS = 30;

describe('faults: repeated SIGKILL', function () {
  this.timeout(600_000);

  it(`loses nothing over ${KILLS} kills at random moments; overcounts exactly what each kill left in its window, at most one batch per shard, as \`tally deviation\` estimates`, async () => {
    const config = { mode: 'two-step' as const, virtualShards: 16, batchSize: 100, prefetch: 2000, markerTtlS: 600 };
    const space = testSpace('f-kill', { TALLY_BATCH_SIZE: String(config.batchSize)});
    const fleet = new DaemonFleet();
    const shape = { maxChanges: 4, maxDelta: 9 };
    const random = seededRandom(7);
    try {
      const workload = generateWorkload({ messages: 200_000, skus: 2_000, seed: 71, duplicateRate: 0.02, badRate: 0.004, idPrefix: space.queue, ...shape });
      const parts = partsById(workload.publishes, config.virtualShards);
      // What each kill had in its crash window, per virtual shard, in units:
      // measured while no daemon runs, as the growth of the units written but
      // not covered by a marker since the previous kill.
      const windows: number[][] = [];
      let unmarkedBefore = new Array<number>(config.virtualShards).fill(0);
      // The whole backlog first: every kill then lands on a daemon under load
      // (its prefetch window full), which is what the estimator speaks of.
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const kills = KILLS;
      let longestDowntimeMs = 0;
      let idleKills = 0;
      for (let k = 0; k < kills; k++) {
        const down = performance.now();
        const readyAtStart = (await queueState(space.queue)).messageCount;
        const daemon = await fleet.start(space.env);
        longestDowntimeMs = Math.max(longestDowntimeMs, performance.now() - down);
        // Under load once it holds half its prefetch window (what the
        // estimator calls loaded); killed after an exponentially distributed
        // time, so the kills are a Poisson process over the loaded time and
        // see its time average (which is what the counters divide).
        await waitForReadyBelow(space.queue, readyAtStart - config.prefetch / 2, 60_000);
        await sleep(-Math.log(1 - random()) * MEAN_LIFE_MS);
        await fleet.kill(daemon);
        // Its unacked deliveries are back: anything more ready means it still had a backlog, so it was under load.
        if ((await queueState(space.queue)).messageCount <= config.prefetch) idleKills++;
        // The victim's last commands may still be in Redis's socket buffer: let Redis finish them.
        await sleep(200);
        const unmarked = await withRedis((redis) => unmarkedUnitsPerShard(redis, space.prefix, config.virtualShards, parts));
        windows.push(unmarked.map((units, v) => units - unmarkedBefore[v]!));
        unmarkedBefore = unmarked;
      }
      // The estimator as an operator runs it after a crash loop, this run's
      // kills as the month's crashes: before the drain, so its counters cover
      // the loaded time the kills were drawn from (a long calm drain would
      // weigh in a steady state no kill sampled).
      const estimate = await deviationFromCli(space.env, kills, `min=0s,max=${Math.ceil(longestDowntimeMs / 1000)}s`);
      await fleet.drain(space.env, space.queue);

      const check = checkCounts(await countsOf(space.prefix, config.virtualShards), workload.truth, config.virtualShards);
      const stats = await statsOf(space.prefix);
      const units = unitsPerMessage(workload.truth, workload.good, shape.maxChanges, shape.maxDelta);
      // The bound is what the kills really had in their windows, not what they could have had at most.
      const windowUnits = windows.map((perShard) => perShard.reduce((a, b) => a + b, 0));
      const bound = windowUnits.reduce((a, b) => a + b, 0);
      // One batch per shard: its batchSize largest parts.
      const oneBatch = Array.from({ length: config.virtualShards }, (_, v) => largestBatchUnits(parts, v, config.batchSize));
      const estimatedUnits = estimate.expectedPerMonth * units.mean;
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
        estimate: estimatedUnits,
        note: `batch ${config.batchSize}; bound = the kills' measured windows (largest ${Math.max(...windowUnits)} units); ${dead.repeats} dead-letter copies repeated after kills`,
      });
      console.log(
        `      windows per kill (units): ${windowUnits.join(' ')}; overcount ${check.overcountUnits}; estimated ${estimatedUnits.toFixed(0)} (W ${estimate.perCrash.window.toFixed(1)} messages over ${estimate.perCrash.loadedSeconds.toFixed(1)} s loaded)`,
      );
      console.log(`      stats ${JSON.stringify(stats)}`);

      expect(fleet.violations, 'daemons that exited on their own').to.deep.equal([]);
      expect(fleet.kills).to.equal(kills);
      expect(idleKills, 'victims that had run out of backlog when killed').to.equal(0);
      expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
      for (const [k, perShard] of windows.entries()) {
        for (const [vshard, units] of perShard.entries()) {
          // Negative: a marker whose counts were never written (a lost count).
          expect(units, `kill ${k + 1}, shard ${vshard}: window`).to.be.within(0, oneBatch[vshard]!);
        }
      }
      expect(bound, 'the kills left something in their windows (else this run tested nothing)').to.be.greaterThan(0);
      // Every windowed part is counted once more on redelivery, and nothing else is:
      // more would be an overcount outside any window, less a counted part never marked nor redelivered (an early ack).
      expect(check.overcountUnits, 'overcount = what the kills left in their windows').to.equal(bound);
      const ratio = check.overcountUnits / estimatedUnits;
      expect(ratio, `measured / estimated by \`tally deviation\` = ${ratio.toFixed(2)}`).to.be.within(0.5, 2);
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
