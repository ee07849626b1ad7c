import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, compare, countsOf, startDaemon, statsOf, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { redeliveryUnderLoad } from './scenarios.js';

describe('redelivery (integration)', function () {
  this.timeout(240_000);

  it('does not count twice what the broker redelivers after the connection is closed under load', () => redeliveryUnderLoad('redeliver'));

  it('recognises redeliveries of a consumer that died before acking, by their markers', async () => {
    const space = testSpace('markers');
    try {
      const workload = generateWorkload({ messages: 2_000, skus: 100, seed: 41, duplicateRate: 0, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      // First pass: the daemon counts everything and acks it.
      const first = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      expect((await stopDaemon(first)).code).to.equal(0);
      // The same messages again, flagged redelivered by the broker: a consumer
      // takes them without acking and closes its channel.
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const connection = await amqp.connect(AMQP_URL);
      const channel = await connection.createChannel();
      await channel.prefetch(5_000);
      let taken = 0;
      await channel.consume(space.queue, () => {
        taken++;
      });
      while (taken < 2_000) await sleep(20);
      await channel.close();
      await connection.close();

      const second = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      expect((await stopDaemon(second)).code).to.equal(0);
      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.duplicates).to.equal(2_000);
      expect(stats.redelivered_unmarked).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });
});
