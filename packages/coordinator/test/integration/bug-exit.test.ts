/**
 * Invariant 13, a bug is not an outage, in a real daemon: TALLY_FAULT_BUG
 * (config.ts) makes its own code fail for real, in a worker thread (a
 * TypeError inside every batch, before any write) or in the main thread (the
 * ack tracker's RangeError inside amqplib's consumer callback, which amqplib
 * would otherwise turn into a lost connection and a reconnect loop). Each
 * time: exit 70, one fatal JSON line carrying the stack of where it
 * happened, no retry logged, nothing acked (every message back in the queue,
 * nothing written), and the next daemon counts everything exactly once.
 *
 * And the other side of the line: real transport failures of ioredis and
 * amqplib stay `transient`.
 */
import { expect } from 'chai';
import amqp from 'amqplib';
import { Redis } from 'ioredis';
import { classifyError, type InjectedBug } from '@tally/shared';
import { freePort } from '@tally/testkit';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, compare, countsOf, drainWithDaemon, queueState, spawnDaemon, statsOf, testSpace, AMQP_URL } from './harness.js';
import { waitFor } from './runtime-probes.js';

interface LogRecord {
  level: number;
  msg: string;
  where?: string;
  failureClass?: string;
  stack?: string;
  exitCode?: number;
}

const FATAL = 60;

const CASES: ReadonlyArray<{ bug: InjectedBug; where: string; stack: RegExp; file: string }> = [
  { bug: 'thread', where: 'batch', stack: /^TypeError: Cannot read properties of undefined \(reading 'parts'\)/, file: 'worker/dist/src/thread.js' },
  { bug: 'main', where: 'delivery', stack: /^RangeError: delivery tag \d+ out of sequence/, file: 'coordinator/dist/src/pipeline/ack-tracker.js' },
];

describe('a bug is not an outage (integration: the daemon exits 70 and acks nothing)', function () {
  this.timeout(120_000);

  for (const { bug, where, stack, file } of CASES) {
    it(`TALLY_FAULT_BUG=${bug}: one fatal line with the ${where} stack, exit 70, no retry, every message left in the queue, counted once by the next daemon`, async () => {
      const space = testSpace(`bug-${bug}`, { TALLY_BATCH_WAIT_MS: '10' });
      try {
        const workload = generateWorkload({ messages: 150, skus: 30, seed: 13, duplicateRate: 0, badRate: 0, idPrefix: space.queue });
        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });

        const daemon = spawnDaemon({ ...space.env, TALLY_FAULT_BUG: bug });
        const timer = setTimeout(() => daemon.child.kill('SIGKILL'), 30_000);
        const exit = await daemon.exited;
        clearTimeout(timer);
        expect(exit, daemon.logs.slice(-5).join('\n')).to.deep.equal({ code: 70, signal: null });

        const records = daemon.logs.map((line) => JSON.parse(line) as LogRecord);
        const fatal = records.filter((r) => r.level >= FATAL);
        expect(fatal, 'exactly one fatal line').to.have.length(1);
        expect(fatal[0]).to.include({ where, failureClass: 'bug', exitCode: 70 });
        expect(fatal[0]!.stack, 'the stack of where it happened').to.match(stack).and.include(file);
        expect(
          records.filter((r) => /retrying|reconnecting|amqp (connection|channel) error/.test(r.msg)).map((r) => r.msg),
          'not retried as an outage',
        ).to.deep.equal([]);

        // Once the broker has dropped the dead consumer, its unacked deliveries are ready again: all of them.
        await waitFor('the consumer to be gone', async () => (await queueState(space.queue)).consumerCount === 0, 10_000, 50);
        expect((await queueState(space.queue)).messageCount, 'nothing was acked').to.equal(workload.publishes.length);
        expect((await countsOf(space.prefix)).size, 'nothing was written').to.equal(0);

        await drainWithDaemon(space.env, space.queue);
        expect(compare(await countsOf(space.prefix), workload.truth).exact, 'counted exactly once by the next daemon').to.equal(true);
        const stats = await statsOf(space.prefix);
        expect(stats.counted).to.equal(workload.good);
        expect(stats.duplicates).to.equal(0);
      } finally {
        await cleanup(space);
      }
    });
  }

  it('real transport failures of ioredis and amqplib stay transient', async () => {
    const closed = await freePort();
    const redis = new Redis({ port: closed, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    redis.on('error', () => {});
    const refused = await redis.connect().then(
      () => null,
      (error: unknown) => error,
    );
    const afterEnd = await redis.get('k').then(
      () => null,
      (error: unknown) => error,
    );
    redis.disconnect();
    const amqpRefused = await amqp.connect(`amqp://guest:guest@127.0.0.1:${closed}`).then(
      () => null,
      (error: unknown) => error,
    );
    const connection = await amqp.connect(AMQP_URL);
    const channel = await connection.createChannel();
    await channel.close();
    let closedChannel: unknown = null;
    try {
      channel.ack({ fields: { deliveryTag: 1 } } as amqp.Message);
    } catch (error) {
      closedChannel = error;
    }
    await connection.close();
    const errors = [refused, afterEnd, amqpRefused, closedChannel];
    expect(
      errors.map((e) => (e as Error | null)?.name ?? null),
      'each a real failure',
    ).to.not.include(null);
    expect(errors.map(classifyError)).to.deep.equal(['transient', 'transient', 'transient', 'transient']);
  });
});
