import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { startProxy } from '@tally/testkit';
import { cleanup, queueState, testSpace, waitForReadyBelow, waitForReadyEmpty, AMQP_URL } from '../test/integration/harness.js';
import { outageOutcome } from './outage-outcome.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

/**
 * Redis away and back, three times mid-batch: two outages that refuse every
 * reconnect for 2 and 3 s and one cut that ioredis heals at once, through a
 * loopback proxy in front of the machine's Redis (the daemon alone goes
 * through it). Nothing may be lost and, with no crash and no lost channel,
 * nothing counted twice: a step that failed is retried under its batch id
 * and its receipt. The outage must also be seen (log lines, retry
 * counters), or a silent wait would pass as a quiet one.
 */
describe('faults: Redis goes away and comes back', function () {
  this.timeout(300_000);

  it('waits out three outages through a loopback proxy, losing nothing and counting nothing twice', async () => {
    const config = { mode: 'two-step' as const, virtualShards: 16, batchSize: 200, prefetch: 2000, markerTtlS: 600 };
    const redisProxy = await startProxy(6379);
    const space = testSpace('f-redis', { TALLY_BATCH_SIZE: String(config.batchSize), TALLY_REDIS_URL: `redis://127.0.0.1:${redisProxy.port}` });
    const fleet = new DaemonFleet();
    const shape = { maxChanges: 4, maxDelta: 9 };
    try {
      const workload = generateWorkload({ messages: 40_000, skus: 2_000, seed: 29, duplicateRate: 0.02, badRate: 0.002, idPrefix: space.queue, ...shape });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const published = (await queueState(space.queue)).messageCount;
      const daemon = await fleet.start(space.env);
      // Two outages that refuse reconnects for a while, one that only drops
      // the connections (ioredis reconnects at once), each mid-batch: at a
      // quarter, a half and three quarters of the backlog taken, so each
      // finds work however fast the machine drains (on timers from the
      // start, the third came after the drain on a machine 1.6x this one's).
      const readyAtOutage: number[] = [];
      for (const [i, outageMs] of [2_000, 0, 3_000].entries()) {
        await waitForReadyBelow(space.queue, (published * (3 - i)) / 4, 60_000);
        readyAtOutage.push((await queueState(space.queue)).messageCount);
        if (outageMs === 0) redisProxy.cutAll();
        else {
          redisProxy.pause();
          await sleep(outageMs);
          redisProxy.resume();
        }
      }
      await waitForReadyEmpty(space.queue, 240_000);
      await sleep(1_500);
      await fleet.stop(daemon);

      const felt = daemon.logs.filter(
        (l) => l.includes('redis step failed') || l.includes('redis connection ended') || l.includes('stats flush failed'),
      ).length;
      const { check, stats, units, bound, estimate, dead } = await outageOutcome(space, workload, config, shape);
      rows.push({
        scenario: 'Redis away (proxy)',
        messages: workload.publishes.length,
        kills: 0,
        lost: check.lostUnits,
        overcount: check.overcountUnits,
        bound,
        estimate: estimate.expectedPerMonth * units.mean,
        note: `outages 2 s, cut, 3 s (${readyAtOutage.join(', ')} ready); ${felt} log lines saw it; write_retries ${stats.write_retries}, occupation_failures ${stats.occupation_failures}`,
      });
      console.log(`      stats ${JSON.stringify(stats)}`);

      expect(fleet.violations, 'the daemon exited on its own').to.deep.equal([]);
      expect(fleet.started, 'one daemon rode out every outage').to.equal(1);
      expect(felt, 'the outages reached the daemon').to.be.greaterThan(0);
      expect(
        readyAtOutage.filter((ready) => ready > 0),
        `messages ready as each outage began: ${readyAtOutage.join(', ')}`,
      ).to.have.length(3);
      expect(check.lostSkus, 'SKUs below the truth: data lost').to.deep.equal([]);
      // No crash, no overcount: a failed write is settled by its receipt, a failed occupation is retried.
      expect(check.overcountUnits).to.be.at.most(bound);
      expect(dead.missing).to.equal(0);
      expect(dead.foreign).to.equal(0);
      expect(dead.repeats, 'no channel was lost, so no dead letter twice').to.equal(0);
      expect(dead.wrongReasons).to.deep.equal([]);
    } finally {
      await fleet.killAll();
      await redisProxy.close();
      await cleanup(space);
    }
  });
});
