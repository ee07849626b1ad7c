/**
 * SIGTERM while Redis hangs: a private redis-server is SIGSTOPped mid-stream
 * (it accepts bytes and answers nothing), then the daemon gets SIGTERM. It
 * must exit within TALLY_SHUTDOWN_GRACE_MS plus the fixed margin, whatever
 * Redis does, and leave nothing acked that was not written: after Redis
 * resumes, a second daemon drains the queue and no count is below the truth.
 *
 * The overcount is the crash window, at most one batch per shard: a count
 * write already sent to the stopped server runs when it resumes, and its
 * deliveries, unacked, come back and are counted again.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, startDaemon, stopDaemon, testSpace, waitForReadyBelow, AMQP_URL, type DaemonProcess } from './harness.js';
import { startPrivateRedis } from '@tally/testkit';
import { brokerQueue, countsAt, waitFor } from './runtime-probes.js';

/** main.ts's SHUTDOWN_MARGIN_MS (CLOSE_BUDGET_MS + 1.5 s): the promise is grace + this. */
export const SHUTDOWN_MARGIN_MS = 4_000;

export interface HungShutdownOutcome {
  readonly messages: number;
  readonly graceMs: number;
  readonly exitMs: number;
  readonly exitCode: number | null;
  readonly lostUnits: number;
  readonly overcountUnits: number;
  /** One batch per shard, each message at most maxChanges × maxDelta units. */
  readonly boundUnits: number;
  readonly firstLogs: readonly string[];
  readonly secondLogs: readonly string[];
}

export async function runHungShutdownScenario(options: { messages: number; seed: number; label: string; graceMs: number }): Promise<HungShutdownOutcome> {
  const server = await startPrivateRedis({ args: ['--maxmemory-policy', 'noeviction'] });
  const batchSize = 100;
  const space = testSpace(options.label, {
    TALLY_REDIS_URL: `redis://127.0.0.1:${server.port}`,
    TALLY_SHUTDOWN_GRACE_MS: String(options.graceMs),
    TALLY_BATCH_SIZE: String(batchSize),
  });
  const shape = { maxChanges: 4, maxDelta: 9 };
  const daemons: DaemonProcess[] = [];
  try {
    const workload = generateWorkload({ messages: options.messages, skus: 1_000, seed: options.seed, duplicateRate: 0.02, idPrefix: space.queue, ...shape });
    await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
    const first = await startDaemon(space.env);
    daemons.push(first);
    await waitForReadyBelow(space.queue, workload.publishes.length - 2_000);

    server.signal('SIGSTOP');
    await sleep(300); // batches now hang on a server that reads nothing back
    const signalledAt = performance.now();
    first.child.kill('SIGTERM');
    const exit = await first.exited;
    const exitMs = performance.now() - signalledAt;
    server.signal('SIGCONT');

    // The broker's view: the first daemon's unacked deliveries are back; a second daemon drains them.
    await waitFor('the first consumer gone', async () => (await brokerQueue(space.queue)).unacked === 0, 30_000);
    const second = await startDaemon(space.env);
    daemons.push(second);
    await waitFor(
      'the queue drained',
      async () => {
        const state = await brokerQueue(space.queue);
        return state.ready === 0 && state.unacked === 0;
      },
      180_000,
      250,
    );
    await sleep(300);
    expect((await stopDaemon(second)).code, 'the second daemon stops cleanly').to.equal(0);

    const counts = await countsAt(`redis://127.0.0.1:${server.port}`, space.prefix);
    let lostUnits = 0;
    let overcountUnits = 0;
    for (const sku of new Set([...counts.keys(), ...workload.truth.keys()])) {
      const diff = (counts.get(sku) ?? 0) - (workload.truth.get(sku) ?? 0);
      if (diff < 0) lostUnits -= diff;
      else overcountUnits += diff;
    }
    return {
      messages: workload.publishes.length,
      graceMs: options.graceMs,
      exitMs,
      exitCode: exit.code,
      lostUnits,
      overcountUnits,
      boundUnits: 16 * batchSize * shape.maxChanges * shape.maxDelta,
      firstLogs: first.logs,
      secondLogs: second.logs,
    };
  } finally {
    server.signal('SIGCONT');
    for (const daemon of daemons) if (daemon.child.exitCode === null && daemon.child.signalCode === null) daemon.child.kill('SIGKILL');
    await cleanup(space).catch(() => {});
    await server.stop();
  }
}
