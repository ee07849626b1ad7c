/**
 * Durable acks with TALLY_REDIS_WAIT_REPLICAS. With WAIT 1 against a private
 * master and replica, counts are exact; with the replica stopped (SIGSTOP)
 * the deliveries stay unacked at the broker and the WAIT timeouts show (log
 * and wait_timeouts); once it continues (SIGCONT) everything is acked and the
 * counts are exact.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, compare, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { countsAt } from './runtime-probes.js';
import { startReplicatedRedis, statsAt, unackedOf } from './replicated-redis.js';

async function waitForUnacked(queue: string, predicate: (n: number) => boolean, timeoutMs = 60_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const unacked = await unackedOf(queue);
    if (predicate(unacked) || Date.now() > deadline) return unacked;
    await sleep(200);
  }
}

describe('TALLY_REDIS_WAIT_REPLICAS (integration, private master and replica)', function () {
  this.timeout(240_000);

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: no ack before the replica has the writes; a stopped replica holds the acks, visibly; counts exact`, async () => {
      const redis = await startReplicatedRedis();
      const space = testSpace(`wait-${mode}`, {
        TALLY_MODE: mode,
        TALLY_REDIS_URL: redis.master.url,
        TALLY_REDIS_WAIT_REPLICAS: '1',
        TALLY_REDIS_WAIT_TIMEOUT_MS: '200',
        TALLY_BATCH_WAIT_MS: '10',
      });
      try {
        const first = generateWorkload({ messages: 300, skus: 50, seed: 5, duplicateRate: 0, idPrefix: `${space.queue}-a` });
        const second = generateWorkload({ messages: 300, skus: 50, seed: 6, duplicateRate: 0, idPrefix: `${space.queue}-b` });
        const daemon = await startDaemon(space.env);
        await publishAll(first.publishes, { url: AMQP_URL, queue: space.queue });
        await waitForReadyEmpty(space.queue);
        expect(await waitForUnacked(space.queue, (n) => n === 0), 'replicated: all acked').to.equal(0);

        process.kill(redis.replica.pid, 'SIGSTOP');
        await publishAll(second.publishes, { url: AMQP_URL, queue: space.queue });
        await waitForReadyEmpty(space.queue);
        await sleep(2_000);
        const held = await unackedOf(space.queue);
        expect(held, 'the replica is stopped: the new deliveries stay unacked').to.equal(second.publishes.length);
        expect(
          daemon.logs.some((l) => l.includes('replicas did not acknowledge')),
          'the WAIT timeouts are logged',
        ).to.equal(true);

        process.kill(redis.replica.pid, 'SIGCONT');
        expect(await waitForUnacked(space.queue, (n) => n === 0), 'the replica caught up: all acked').to.equal(0);
        const exit = await stopDaemon(daemon);
        expect(exit.code).to.equal(0);

        const truth = new Map(first.truth);
        for (const [sku, n] of second.truth) truth.set(sku, (truth.get(sku) ?? 0) + n);
        expect(compare(await countsAt(redis.master.url, space.prefix), truth).exact, 'counts exact on the master').to.equal(true);
        expect(compare(await countsAt(redis.replica.url, space.prefix), truth).exact, 'and on the replica').to.equal(true);
        const stats = await statsAt(redis.master.url, space.prefix);
        expect(stats.wait_timeouts, 'wait_timeouts counted').to.be.greaterThan(0);
        console.log(`      ${mode}: ${held} deliveries held while the replica was stopped; wait_timeouts ${stats.wait_timeouts}`);
      } finally {
        await redis.stop();
        await cleanup(space);
      }
    });
  }
});
