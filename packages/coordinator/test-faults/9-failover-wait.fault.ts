import { once } from 'node:events';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { startPrivateRedis, startProxy, type PrivateRedis } from '@tally/testkit';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, testSpace, waitForReadyBelow, waitForReadyEmpty, AMQP_URL } from '../test/integration/harness.js';
import { countsAt } from '../test/integration/runtime-probes.js';
import { startReplicatedRedis, waitForLink } from '../test/integration/replicated-redis.js';
import { checkCounts } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

/**
 * A failover to a replica that lags. The daemon reaches a
 * private master through a TCP proxy; mid-stream replication is stalled
 * (the replica SIGSTOPped for a second), the master is SIGKILLed, the replica
 * is promoted (REPLICAOF NO ONE) before it has read what the master had sent
 * it, and the proxy pointed at it, and a fresh
 * replica follows the new master. Without WAIT the deliveries acked during
 * the stall are lost with the old master: measured and reported, not
 * asserted (it depends on what was in flight). With
 * TALLY_REDIS_WAIT_REPLICAS=1 nothing was acked that the replica did not
 * have: lost must be 0.
 */
describe('faults: a failover without WAIT against one with it', function () {
  this.timeout(300_000);

  for (const waitReplicas of [0, 1]) {
    it(`WAIT ${waitReplicas}: SIGKILL the master during a replication stall, promote the replica`, async () => {
      const virtualShards = 16;
      const redis = await startReplicatedRedis();
      const proxy = await startProxy(redis.master.port);
      let follower: PrivateRedis | null = null;
      const space = testSpace(`f-failover-w${waitReplicas}`, {
        TALLY_REDIS_URL: `redis://127.0.0.1:${proxy.port}`,
        TALLY_REDIS_WAIT_REPLICAS: String(waitReplicas),
        TALLY_REDIS_WAIT_TIMEOUT_MS: '300',
        TALLY_BATCH_SIZE: '100',
      });
      const fleet = new DaemonFleet();
      try {
        const workload = generateWorkload({ messages: 30_000, skus: 2_000, seed: 17, duplicateRate: 0, badRate: 0, idPrefix: space.queue, maxChanges: 4 });
        // A quarter is published first and the rest once the replica is stopped, so that there are writes
        // during the stall however fast the daemon drains (a backlog published up front can be gone before
        // the fault: the cluster failover scenario lost two CI runs to that, e5122c9).
        const firstPart = Math.floor(workload.publishes.length / 4);
        await publishAll(workload.publishes.slice(0, firstPart), { url: AMQP_URL, queue: space.queue });
        const daemon = await fleet.start(space.env);
        // Mid-stream, on progress: half of that first quarter taken.
        await waitForReadyBelow(space.queue, Math.floor(firstPart / 2));

        // Replication stalls for a second (or for as long as publishing the rest takes, if that is longer);
        // whatever is acked meanwhile exists on the master only.
        process.kill(redis.replica.pid, 'SIGSTOP');
        await Promise.all([publishAll(workload.publishes.slice(firstPart), { url: AMQP_URL, queue: space.queue }), sleep(1_000)]);
        process.kill(redis.master.pid, 'SIGKILL');
        // The promotion is queued while the replica is still stopped: it runs
        // in the replica's first turns, before it has read the rest of the
        // stream the master sent it during the stall, which is then dropped
        // as a lagging replica's would be. Sent after SIGCONT instead, it
        // usually arrives after the replica caught up, and the failover loses
        // nothing a WAIT could have guarded.
        const promotion = net.connect(redis.replica.port, '127.0.0.1');
        await once(promotion, 'connect');
        promotion.write('*3\r\n$9\r\nREPLICAOF\r\n$2\r\nNO\r\n$3\r\nONE\r\n');
        await sleep(50); // the command is in the replica's socket buffer
        process.kill(redis.replica.pid, 'SIGCONT');
        const [reply] = (await once(promotion, 'data')) as [Buffer];
        promotion.destroy();
        expect(reply.toString('latin1'), 'the replica was promoted').to.match(/^\+OK/);
        proxy.retarget(redis.replica.port);
        proxy.cutAll();
        // The promoted master gets a replica of its own, or WAIT 1 could never be satisfied again.
        follower = await startPrivateRedis({ args: ['--replicaof', '127.0.0.1', String(redis.replica.port)] });
        await waitForLink(follower.url);

        await waitForReadyEmpty(space.queue, 240_000);
        await sleep(1_500);
        await fleet.stop(daemon);
        await fleet.drain(space.env, space.queue);

        const check = checkCounts(await countsAt(redis.replica.url, space.prefix, virtualShards), workload.truth, virtualShards);
        const waitTimeouts = fleet.logs.filter((l) => l.includes('replicas did not acknowledge')).length;
        rows.push({
          scenario: `failover to a lagging replica, WAIT ${waitReplicas}`,
          messages: workload.publishes.length,
          kills: 1,
          lost: check.lostUnits,
          overcount: check.overcountUnits,
          bound: 0,
          estimate: 0,
          note: `replica stopped 1 s, master SIGKILLed, replica promoted; ${check.lostSkus.length} SKUs short; ${waitTimeouts} WAIT timeouts logged`,
        });
        console.log(
          `      WAIT ${waitReplicas}: lost ${check.lostUnits} units over ${check.lostSkus.length} SKUs, overcount ${check.overcountUnits}, ${waitTimeouts} WAIT timeouts logged`,
        );

        expect(fleet.violations, 'no daemon exited on its own').to.deep.equal([]);
        if (waitReplicas > 0) {
          expect(check.lostSkus, 'with WAIT nothing acked was lost').to.deep.equal([]);
          expect(waitTimeouts, 'the stall showed').to.be.greaterThan(0);
        }
      } finally {
        await fleet.killAll();
        await proxy.close();
        await follower?.stop();
        await redis.stop();
        await cleanup(space);
      }
    });
  }
});
