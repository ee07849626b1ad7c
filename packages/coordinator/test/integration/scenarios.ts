/**
 * Scenarios that run in both modes: the same steps and the same checks, the
 * mode (and anything else) given as environment.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { startProxy } from '@tally/testkit';
import {
  cleanup,
  closeConnections,
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

/**
 * Closes the daemon's connection three times while it drains a backlog: once
 * from the broker (rabbitmqctl), twice by cutting a loopback proxy in front
 * of RabbitMQ at exact progress points. The backlog keeps deliveries in
 * flight at every cut however fast the daemon is. Nothing may be lost or
 * counted twice, and the broker must have redelivered.
 */
export async function redeliveryUnderLoad(label: string, env: Record<string, string> = {}): Promise<void> {
  const proxy = await startProxy(5672);
  const space = testSpace(label, { TALLY_BATCH_SIZE: '200', TALLY_AMQP_URL: `amqp://guest:guest@127.0.0.1:${proxy.port}`, ...env });
  try {
    const total = 60_000;
    const workload = generateWorkload({ messages: total, skus: 500, seed: 31, duplicateRate: 0, idPrefix: space.queue });
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
    expect((await stopDaemon(daemon)).code).to.equal(0);
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
}
