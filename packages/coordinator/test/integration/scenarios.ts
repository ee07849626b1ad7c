/**
 * Scenarios that run in both modes: the same steps and the same checks, the
 * mode (and anything else) given as environment.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { startProxy } from '@tally/testkit';
import type { Publish } from '@tally/workload';
import {
  cleanup,
  closeConnections,
  compare,
  countsOf,
  killDaemon,
  publishPaced,
  queueState,
  receiptCount,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  waitForReadyBelow,
  waitForReadyEmpty,
  waitForLogCount,
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
    const consuming = '"msg":"consuming"';
    // Each closure must hit a daemon that consumes again after the one
    // before: a cut that lands on a reconnect in progress would test less.
    let closures = 0;
    await waitForReadyBelow(space.queue, total - 5_000);
    expect(await closeConnections(`tally-coordinator-${daemon.child.pid}`), 'connections closed by rabbitmqctl').to.equal(1);
    await waitForLogCount(daemon, consuming, ++closures + 1);
    for (const left of [total / 2, total / 4]) {
      await waitForReadyBelow(space.queue, left);
      proxy.cutAll();
      await waitForLogCount(daemon, consuming, ++closures + 1);
    }
    await waitForReadyEmpty(space.queue);
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

/**
 * SIGKILLs a daemon mid-stream `cycles` times: each cycle publishes its
 * slice of `publishes` while a fresh daemon starts, waits for that daemon's
 * first batch (a new write receipt), then kills it 0-150 ms later, so every
 * kill lands on a daemon at work with messages arriving, however fast it
 * drains. Returns how many kills came after the daemon had written.
 */
export async function killMidStream(
  env: Record<string, string>,
  queue: string,
  prefix: string,
  publishes: readonly Publish[],
  cycles: number,
): Promise<number> {
  const slice = Math.ceil(publishes.length / cycles);
  let killsMidStream = 0;
  for (let cycle = 0; cycle < cycles; cycle++) {
    const batchesBefore = await receiptCount(prefix);
    const publishing = publishPaced(publishes.slice(cycle * slice, (cycle + 1) * slice), queue, 25, 20);
    const daemon = await startDaemon(env);
    const deadline = Date.now() + 5_000;
    let wrote = false;
    while (!wrote && Date.now() < deadline) {
      wrote = (await receiptCount(prefix)) > batchesBefore;
      if (!wrote) await sleep(10);
    }
    await sleep(Math.floor(Math.random() * 150));
    if (wrote) killsMidStream++;
    expect((await killDaemon(daemon)).signal).to.equal('SIGKILL');
    await publishing;
  }
  return killsMidStream;
}
