import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll, seededRandom } from '@tally/workload';
import { startProxy } from '@tally/testkit';
import { cleanup, testSpace, waitForReadyEmpty, AMQP_URL } from '../test/integration/harness.js';
import { outageOutcome } from './outage-outcome.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

/**
 * The broker connection cut four times while the daemon drains, each cut
 * just after a quarter of the messages is published (a loopback proxy in
 * front of RabbitMQ, for this daemon's connection only). Every cut makes
 * the broker redeliver what was unacked. The daemon must reconnect on its
 * own each time; nothing may be lost, and the overcount stays within its
 * bound (a cut can fall in a batch's window between its count write and its
 * marker, as a crash can); every bad message reaches the dead-letter queue
 * with its reason, twice when a cut came before its ack.
 */
describe('faults: RabbitMQ connections drop', function () {
  this.timeout(300_000);

  it('reconnects after every cut and goes on, the markers catching what the broker redelivers', async () => {
    const config = { mode: 'two-step' as const, virtualShards: 16, batchSize: 200, prefetch: 2000, markerTtlS: 600 };
    // Only this daemon's connection goes through the proxy; the publisher and
    // every other engineer's consumers talk to the broker directly.
    const amqpProxy = await startProxy(5672);
    const space = testSpace('f-amqp', { TALLY_BATCH_SIZE: String(config.batchSize), TALLY_AMQP_URL: `amqp://guest:guest@127.0.0.1:${amqpProxy.port}` });
    const fleet = new DaemonFleet();
    const shape = { maxChanges: 4, maxDelta: 9 };
    const random = seededRandom(37);
    try {
      const workload = generateWorkload({ messages: 40_000, skus: 2_000, seed: 43, duplicateRate: 0.02, badRate: 0.004, idPrefix: space.queue, ...shape });
      const daemon = await fleet.start(space.env);
      const cuts = 4;
      // A quarter of the messages published before each cut, the cut coming just after: the daemon holds
      // deliveries at every cut however fast it drains. (With everything published up front while the cuts
      // came on a timer, a machine about 2.5 times this one would drain it all before the first cut, and
      // nothing would be redelivered.)
      const chunk = Math.ceil(workload.publishes.length / cuts);
      for (let c = 0; c < cuts; c++) {
        // Wait for the reconnect after the previous cut before cutting again.
        const deadline = Date.now() + 60_000;
        while (daemon.logs.filter((l) => l.includes('"msg":"consuming"')).length < c + 1 && Date.now() < deadline) await sleep(25);
        await publishAll(workload.publishes.slice(c * chunk, (c + 1) * chunk), { url: AMQP_URL, queue: space.queue });
        await sleep(random() * 200);
        amqpProxy.cutAll();
      }
      await waitForReadyEmpty(space.queue, 240_000);
      await sleep(1_500);
      await fleet.stop(daemon);

      const reconnects = daemon.logs.filter((l) => l.includes('"msg":"consuming"')).length - 1;
      const { check, stats, units, bound, estimate, dead } = await outageOutcome(space, workload, config, shape);
      rows.push({
        scenario: 'RabbitMQ drops (proxy)',
        messages: workload.publishes.length,
        kills: 0,
        lost: check.lostUnits,
        overcount: check.overcountUnits,
        bound,
        estimate: estimate.expectedPerMonth * units.mean,
        note: `${cuts} cuts, ${reconnects} reconnects; ${stats.received - workload.publishes.length} redeliveries; ${dead.repeats} dead letters repeated`,
      });
      console.log(`      stats ${JSON.stringify(stats)}`);

      expect(fleet.violations, 'the daemon exited on its own').to.deep.equal([]);
      expect(fleet.started, 'one daemon rode out every cut').to.equal(1);
      expect(reconnects, 'reconnected after each cut').to.be.at.least(cuts);
      expect(stats.received, 'the broker redelivered the lost channels’ deliveries').to.be.greaterThan(workload.publishes.length);
      expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
      expect(check.overcountUnits).to.be.at.most(bound);
      expect(dead.missing).to.equal(0);
      expect(dead.foreign).to.equal(0);
      expect(dead.wrongReasons).to.deep.equal([]);
    } finally {
      await fleet.killAll();
      await amqpProxy.close();
      await cleanup(space);
    }
  });
});
