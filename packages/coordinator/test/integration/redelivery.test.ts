import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload, publishAll, startProxy } from '@tally/bench';
import { cleanup, compare, countsOf, queueState, startDaemon, statsOf, stopDaemon, testSpace, waitForReadyBelow, waitForReadyEmpty, AMQP_URL } from './harness.js';

const run = promisify(execFile);

/** Closes, from the broker's side, every connection whose client named itself with `namePrefix`. */
async function closeConnections(namePrefix: string): Promise<number> {
  const { stdout } = await run('rabbitmqctl', ['list_connections', '-q', '--no-table-headers', 'pid', 'client_properties'], { timeout: 30_000 });
  let closed = 0;
  for (const line of stdout.split('\n')) {
    if (!line.includes(namePrefix)) continue;
    const pid = line.split('\t')[0]!.trim();
    await run('rabbitmqctl', ['close_connection', pid, 'test: simulated connection loss'], { timeout: 30_000 });
    closed++;
  }
  return closed;
}

describe('redelivery (integration)', function () {
  this.timeout(240_000);

  it('does not count twice what the broker redelivers after the connection is closed under load', async () => {
    // The daemon talks to RabbitMQ through a loopback proxy, so the test can
    // also cut the connection at an exact moment; the first closure comes
    // from the broker itself (rabbitmqctl close_connection).
    const proxy = await startProxy(5672);
    const space = testSpace('redeliver', { TALLY_BATCH_SIZE: '200', TALLY_AMQP_URL: `amqp://guest:guest@127.0.0.1:${proxy.port}` });
    try {
      const total = 60_000;
      const workload = generateWorkload({ messages: total, skus: 500, seed: 31, duplicateRate: 0, idPrefix: space.queue });
      // A backlog, so that deliveries are in flight at every cut however fast the daemon is.
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const daemon = await startDaemon(space.env);
      let closures = 0;
      await waitForReadyBelow(space.queue, total - 5_000);
      closures += await closeConnections(`tally-coordinator-${daemon.child.pid}`);
      for (const left of [total / 2, total / 4]) {
        await waitForReadyBelow(space.queue, left);
        proxy.cutAll();
        closures++;
      }
      expect(closures, 'connections closed').to.be.at.least(3);
      await waitForReadyEmpty(space.queue);
      await sleep(500);
      expect(daemon.logs.filter((l) => l.includes('"msg":"consuming"')).length, 'reconnected after each closure').to.be.at.least(closures + 1);
      const exit = await stopDaemon(daemon);
      expect(exit.code).to.equal(0);
      expect((await queueState(space.queue)).messageCount).to.equal(0);

      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.below, 'lost').to.deep.equal([]);
      expect(diff.excess.size, 'counted twice').to.equal(0);
      const stats = await statsOf(space.prefix);
      expect(stats.received, 'the broker did redeliver').to.be.greaterThan(workload.good);
      expect(stats.counted + stats.duplicates).to.equal(stats.received);
    } finally {
      await proxy.close();
      await cleanup(space);
    }
  });

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
