import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import {
  cleanup,
  compare,
  countsOf,
  queueState,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  waitForReadyBelow,
  waitForReadyEmpty,
  AMQP_URL,
} from './harness.js';

describe('shutdown (integration)', function () {
  this.timeout(180_000);

  it('on SIGTERM mid-stream finishes and acks what is in flight, exits 0, and a restart completes the counts exactly', async () => {
    const space = testSpace('sigterm', { TALLY_BATCH_WAIT_MS: '200' });
    try {
      const workload = generateWorkload({ messages: 20_000, skus: 1_000, seed: 61, duplicateRate: 0.02, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const first = await startDaemon(space.env);
      // SIGTERM on progress, not on a clock: after 700 ms, one CI run's daemon had drained all 20,000.
      await waitForReadyBelow(space.queue, Math.floor(workload.publishes.length * 0.9), 60_000);
      const started = Date.now();
      const exit = await stopDaemon(first);
      expect(exit.code, 'exit code after SIGTERM').to.equal(0);
      expect(Date.now() - started, 'within the grace period').to.be.below(30_000);
      expect(first.logs.some((l) => l.includes('"msg":"stopped"'))).to.equal(true);
      // A clean stop closes its channel on purpose: no lost-channel warning, no unacked left behind.
      const stopLogs = first.logs.slice(first.logs.findIndex((l) => l.includes('"msg":"signal received"')));
      expect(
        stopLogs.filter((l) => l.includes('left to redelivery') || l.includes('"level":40')),
        'no warning on a clean stop',
      ).to.deep.equal([]);
      expect(stopLogs.some((l) => l.includes('"msg":"channel closed"'))).to.equal(true);
      const midway = await queueState(space.queue);
      expect(midway.consumerCount).to.equal(0);
      expect(midway.messageCount, 'stopped mid-stream').to.be.greaterThan(0);
      const statsMid = await statsOf(space.prefix);
      expect(statsMid.received + midway.messageCount, 'every delivery taken was acked, none went back').to.equal(workload.publishes.length);

      const second = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      await sleep(300);
      expect((await stopDaemon(second)).code).to.equal(0);
      expect((await queueState(space.queue)).messageCount, 'queue empty').to.equal(0);
      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.duplicates).to.equal(workload.duplicates);
    } finally {
      await cleanup(space);
    }
  });

  it('exits 0 on SIGINT when idle', async () => {
    const space = testSpace('sigint');
    try {
      const daemon = await startDaemon(space.env);
      daemon.child.kill('SIGINT');
      expect((await daemon.exited).code).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });
});
