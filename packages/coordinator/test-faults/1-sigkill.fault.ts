import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll, seededRandom } from '@tally/workload';
import { cleanup, countsOf, queueState, statsOf, testSpace, waitForReadyBelow, withRedis, AMQP_URL } from '../test/integration/harness.js';
import { largestBatchUnits, partsById, unmarkedUnitsPerShard, UnmarkedLedger } from '../test/integration/crash-window.js';
import { checkCounts, checkDeadLetters, deviationFromCli, unitsPerMessage } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { bootstrapMean } from './resampling.js';
import { rows } from './report.js';

/**
 * The victims killed for real: the loss and overcount checks (the overcount
 * must equal what these kills left in their windows).
 */
const KILLS = 12;
/**
 * Before its kill, each victim is frozen (SIGSTOP) this many times and
 * measured as if killed: what a SIGKILL at that instant would re-count.
 * These samples, with the kills', are what the estimate is checked against.
 */
const FREEZES_PER_VICTIM = 7;
/**
 * Mean loaded time between two events (freeze or kill) of a victim, each gap
 * exponentially distributed: the events are a Poisson process over loaded
 * time and see its time average, which is what W is.
 */
const MEAN_GAP_MS = 300;
/**
 * A freeze lasts at least this long, so that the daemon's exposure meter
 * (which leaves out sample intervals over 500 ms: the process was not
 * running) does not count the frozen time as loaded time.
 */
const FROZEN_AT_LEAST_MS = 650;
/**
 * The samples' mean must be within a factor of 2 of the estimate. One sample
 * is lumpy (about half land inside a window, and then several shards at
 * once), and a victim's samples are correlated, but the mean of 96 is
 * steady: a bootstrap over the victims of three runs (36 victims, each
 * victim's 8 samples resampled together, each run scaled by its own mean)
 * gives the mean of a 12-victim run a relative standard error of 0.13
 * (log-scale 0.14, so 2x is 5 standard errors away on either side), and not
 * one of 200,000 resampled runs fell outside 0.5..2: the false-failure
 * rate of an exact estimate is below 1 in 100,000. A W off by 2.5x fails
 * about 95% of the time (it passes only if the samples stray 25% its way:
 * 4% of resamples for a W too high, 6% too low), one off by 3x over 99%.
 * A tolerance of 1.5 would catch a W off by 2x, but fail an exact one in
 * about 0.6% of runs; CI must not fail by luck.
 */
const TOLERANCE = 2;

describe('faults: repeated SIGKILL', function () {
  this.timeout(600_000);

  it(`loses nothing over ${KILLS} kills at random moments; overcounts exactly what each kill left in its window, at most one batch per shard; \`tally deviation\`'s W matches ${KILLS * (FREEZES_PER_VICTIM + 1)} sampled windows`, async () => {
    const config = { mode: 'two-step' as const, virtualShards: 16, batchSize: 100, prefetch: 2000, markerTtlS: 600 };
    const space = testSpace('f-kill', { TALLY_BATCH_SIZE: String(config.batchSize) });
    const fleet = new DaemonFleet();
    const shape = { maxChanges: 4, maxDelta: 9 };
    const random = seededRandom(7);
    try {
      const workload = generateWorkload({ messages: 800_000, skus: 2_000, seed: 71, duplicateRate: 0.02, badRate: 0.004, idPrefix: space.queue, ...shape });
      const parts = partsById(workload.publishes, config.virtualShards);
      const ledger = new UnmarkedLedger(workload.publishes, parts, space.prefix, config.virtualShards, config.prefetch);
      // One batch per shard: its batchSize largest parts.
      const oneBatch = Array.from({ length: config.virtualShards }, (_, v) => largestBatchUnits(parts, v, config.batchSize));
      // Units written but not covered by a marker, per shard, right after the
      // last kill: the overcount so far. A kill (or a freeze) at any later
      // moment finds that plus its own window.
      let overcountSoFar = new Array<number>(config.virtualShards).fill(0);
      const killWindows: number[][] = [];
      /** Per victim, what each of its freezes and its kill had in its windows (units, all shards). */
      const samplesPerVictim: number[][] = [];
      const shardWindows: { event: string; perShard: number[] }[] = [];
      // The whole backlog first: every event then lands on a daemon under load
      // (its prefetch window full), which is what the estimator speaks of.
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const published = workload.publishes.length;
      const phaseStart = performance.now();
      let longestDowntimeMs = 0;
      let idleEvents = 0;
      let longestMeasureMs = 0;
      await withRedis(async (redis) => {
        for (let k = 0; k < KILLS; k++) {
          const down = performance.now();
          const readyAtStart = (await queueState(space.queue)).messageCount;
          // A fast machine drains the backlog sooner: say so plainly rather than wait for a count below zero.
          expect(readyAtStart, `victim ${k + 1}: backlog left before it starts (a larger backlog is needed on a machine this fast)`).to.be.above(
            config.prefetch,
          );
          const daemon = await fleet.start(space.env);
          longestDowntimeMs = Math.max(longestDowntimeMs, performance.now() - down);
          // Under load once it holds half its prefetch window (what the estimator calls loaded).
          await waitForReadyBelow(space.queue, readyAtStart - config.prefetch / 2, 60_000);
          const samples: number[] = [];
          for (let f = 0; f < FREEZES_PER_VICTIM; f++) {
            await sleep(-Math.log(1 - random()) * MEAN_GAP_MS);
            const frozenAt = performance.now();
            daemon.child.kill('SIGSTOP');
            // What it sent before it stopped may still be in Redis's socket buffer: let Redis run it.
            await sleep(200);
            const ready = (await queueState(space.queue)).messageCount;
            if (ready === 0) idleEvents++;
            const unmarked = await ledger.measure(redis, published - ready);
            const perShard = unmarked.map((units, v) => units - overcountSoFar[v]!);
            shardWindows.push({ event: `victim ${k + 1}, freeze ${f + 1}`, perShard });
            samples.push(perShard.reduce((a, b) => a + b, 0));
            longestMeasureMs = Math.max(longestMeasureMs, performance.now() - frozenAt);
            await sleep(Math.max(0, FROZEN_AT_LEAST_MS - (performance.now() - frozenAt)));
            daemon.child.kill('SIGCONT');
          }
          await sleep(-Math.log(1 - random()) * MEAN_GAP_MS);
          await fleet.kill(daemon);
          // Its unacked deliveries are back: anything more ready means it still had a backlog, so it was under load.
          const ready = (await queueState(space.queue)).messageCount;
          if (ready <= config.prefetch) idleEvents++;
          await sleep(200);
          // The full scan, which needs no assumption about the queue's order, against the ledger the freezes use.
          const scanned = await unmarkedUnitsPerShard(redis, space.prefix, config.virtualShards, parts);
          const fromLedger = await ledger.measure(redis, published - ready);
          expect(fromLedger, `kill ${k + 1}: the ledger against the full scan`).to.deep.equal(scanned);
          const perShard = scanned.map((units, v) => units - overcountSoFar[v]!);
          killWindows.push(perShard);
          shardWindows.push({ event: `kill ${k + 1}`, perShard });
          samples.push(perShard.reduce((a, b) => a + b, 0));
          samplesPerVictim.push(samples);
          overcountSoFar = scanned;
        }
      });
      const phaseSeconds = (performance.now() - phaseStart) / 1000;
      // The estimator as an operator runs it after a crash loop, this run's
      // kills as the month's crashes: before the drain, so its counters cover
      // the loaded time the samples were drawn from (a long calm drain would
      // weigh in a steady state no event sampled).
      const estimate = await deviationFromCli(space.env, KILLS, `min=0s,max=${Math.ceil(longestDowntimeMs / 1000)}s`);
      await fleet.drain(space.env, space.queue);

      const check = checkCounts(await countsOf(space.prefix, config.virtualShards), workload.truth, config.virtualShards);
      const stats = await statsOf(space.prefix);
      const units = unitsPerMessage(workload.truth, workload.good, shape.maxChanges, shape.maxDelta);
      // The bound is what the kills really had in their windows, not what they could have had at most.
      const killUnits = killWindows.map((perShard) => perShard.reduce((a, b) => a + b, 0));
      const bound = killUnits.reduce((a, b) => a + b, 0);
      const allSamples = samplesPerVictim.flat();
      const sampledMean = allSamples.reduce((a, b) => a + b, 0) / allSamples.length;
      const estimatedPerCrash = estimate.perCrash.window * units.mean;
      const ratio = sampledMean / estimatedPerCrash;
      const spread = bootstrapMean(samplesPerVictim, 1 / TOLERANCE, TOLERANCE, 10_000, seededRandom(5));
      const dead = await checkDeadLetters(
        space.queue,
        workload.publishes.filter((p) => p.kind === 'bad').map((p) => ({ body: p.body, messageId: p.messageId, codes: new Set([p.reason!]) })),
      );
      rows.push({
        scenario: 'repeated SIGKILL',
        messages: workload.publishes.length,
        kills: KILLS,
        lost: check.lostUnits,
        overcount: check.overcountUnits,
        bound,
        estimate: KILLS * estimatedPerCrash,
        note: `batch ${config.batchSize}; bound = the kills' measured windows; ${allSamples.length} windows sampled (${KILLS} kills + freezes): mean ${sampledMean.toFixed(0)} units vs W × units ${estimatedPerCrash.toFixed(0)} (ratio ${ratio.toFixed(2)}, relative SE ${spread.relativeStandardError.toFixed(2)}); ${dead.repeats} dead-letter copies repeated after kills`,
      });
      console.log(`      kill windows (units): ${killUnits.join(' ')}; overcount ${check.overcountUnits}`);
      console.log(`      samples per victim (units): ${samplesPerVictim.map((samples) => samples.join(',')).join(' | ')}`);
      console.log(
        `      sampled mean ${sampledMean.toFixed(1)} units over ${allSamples.length} (${allSamples.filter((units) => units > 0).length} inside a window); W ${estimate.perCrash.window.toFixed(1)} messages × ${units.mean.toFixed(2)} units = ${estimatedPerCrash.toFixed(1)} over ${estimate.perCrash.loadedSeconds.toFixed(1)} s loaded; ratio ${ratio.toFixed(3)}; bootstrap over victims: relative SE ${spread.relativeStandardError.toFixed(3)}, outside 1/${TOLERANCE}..${TOLERANCE} ${(spread.outsideShare * 100).toFixed(2)}%`,
      );
      console.log(
        `      kill phase ${phaseSeconds.toFixed(0)} s; longest freeze measurement ${longestMeasureMs.toFixed(0)} ms; stats ${JSON.stringify(stats)}`,
      );

      expect(fleet.violations, 'daemons that exited on their own').to.deep.equal([]);
      expect(fleet.kills).to.equal(KILLS);
      expect(idleEvents, 'victims that had run out of backlog when frozen or killed').to.equal(0);
      // The ledger trusts that markers outlive the kill phase.
      expect(phaseSeconds, 'kill phase shorter than the marker TTL').to.be.below(config.markerTtlS);
      expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
      for (const { event, perShard } of shardWindows) {
        for (const [vshard, windowUnits] of perShard.entries()) {
          // Negative: a marker whose counts were never written (a lost count).
          expect(windowUnits, `${event}, shard ${vshard}: window`).to.be.within(0, oneBatch[vshard]!);
        }
      }
      expect(sampledMean, 'the events found something in their windows (else this run tested nothing)').to.be.greaterThan(0);
      // Every windowed part is counted once more on redelivery, and nothing else is:
      // more would be an overcount outside any window, less a counted part never marked nor redelivered (an early ack).
      expect(check.overcountUnits, 'overcount = what the kills left in their windows').to.equal(bound);
      expect(ratio, `sampled windows / W of \`tally deviation\` = ${ratio.toFixed(2)}`).to.be.within(1 / TOLERANCE, TOLERANCE);
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
