import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload, publishAll, type Publish } from '@tally/workload';
import { deadLetterReason, shardOf } from '@tally/shared';
import { markerEntry, readMarkers } from '@tally/testkit';
import { createLogger } from '../../src/process/logger.js';
import { declareTallyQueues } from '../../src/amqp/queue-declaration.js';
import {
  pinMarkerScope,
  cleanup,
  compare,
  countsOf,
  drainQueue,
  drainWithDaemon,
  killDaemon,
  queueState,
  startDaemon,
  statsOf,
  testSpace,
  waitForReadyBelow,
  withRedis,
  AMQP_URL,
  type TestSpace,
} from './harness.js';

const run = promisify(execFile);

/** The broker's own word on a queue's type. */
async function queueType(queue: string): Promise<string | undefined> {
  const { stdout } = await run('rabbitmqctl', ['list_queues', '-q', '--no-table-headers', 'name', 'type'], { timeout: 60_000 });
  for (const line of stdout.split('\n')) {
    const [name, type] = line.trim().split(/\s+/);
    if (name === queue) return type;
  }
  return undefined;
}

/** Declares the queues as the daemon would, before anything is published (the publisher would otherwise create a classic queue). */
async function declareAsTally(space: TestSpace, deliveryLimit: number): Promise<void> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    await declareTallyQueues(
      connection,
      { queue: space.queue, deadLetterQueue: `${space.queue}.dead`, queueType: 'quorum', deliveryLimit },
      createLogger('silent', { component: 'test' }),
    );
  } finally {
    await connection.close().catch(() => {});
  }
}

interface Good {
  readonly id: string;
  readonly changes: Array<{ sku: string; delta: number }>;
}

function goodMessages(publishes: readonly Publish[]): Good[] {
  return publishes
    .filter((p) => p.kind === 'good')
    .map((p) => ({ id: p.id!, changes: (JSON.parse(p.body.toString('utf8')) as { changes: Good['changes'] }).changes }));
}

function truthOf(messages: readonly Good[]): Map<string, number> {
  const truth = new Map<string, number>();
  for (const m of messages) for (const c of m.changes) truth.set(c.sku, (truth.get(c.sku) ?? 0) + c.delta);
  for (const [sku, value] of truth) if (value === 0) truth.delete(sku);
  return truth;
}

/**
 * A consumer that dies on what it takes: receives up to `take` deliveries,
 * never acks them, and closes its channel, so each one's delivery count goes
 * up by one. Run it a few times and the same messages climb past the limit.
 */
async function crashingConsumer(queue: string, take: number): Promise<number> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const channel = await connection.createChannel();
    await channel.prefetch(take);
    let received = 0;
    await channel.consume(queue, () => received++, { noAck: false });
    const deadline = Date.now() + 3_000;
    while (received < take && Date.now() < deadline) await sleep(20);
    await channel.close();
    return received;
  } finally {
    await connection.close().catch(() => {});
  }
}

describe('quorum queues (integration: the local RabbitMQ)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(300_000);

  it('TALLY_QUEUE_TYPE=quorum: the daemon declares quorum queues and counts exactly, with duplicates and bad messages', async () => {
    const space = testSpace('quorum', { TALLY_QUEUE_TYPE: 'quorum', TALLY_BATCH_SIZE: '100' });
    try {
      // The daemon declares the queues: start it on the empty queue first.
      const first = await startDaemon(space.env);
      expect(first.logs.filter((l) => l.includes('"msg":"queue declared"') && l.includes('"type":"quorum"'))).to.have.length(2);
      const workload = generateWorkload({ messages: 3_000, skus: 300, seed: 21, duplicateRate: 0.05, badRate: 0.02, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyBelow(space.queue, 1);
      await sleep(500);
      // Stop it cleanly and drain whatever was redelivered.
      first.child.kill('SIGTERM');
      expect((await first.exited).code).to.equal(0);
      await drainWithDaemon(space.env, space.queue);

      expect(await queueType(space.queue)).to.equal('quorum');
      expect(await queueType(`${space.queue}.dead`)).to.equal('quorum');
      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.exact, `below ${diff.below.length}, excess ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.dead_lettered).to.equal(workload.bad);
      expect(stats.counted).to.equal(workload.good);
      const dead = await drainQueue(`${space.queue}.dead`);
      expect(dead).to.have.length(workload.bad);
      for (const message of dead) expect(deadLetterReason(message.properties.headers).source).to.equal('tally');
    } finally {
      await cleanup(space);
    }
  });

  it('uses an existing classic queue as it is when quorum is asked for, and says what it found', async () => {
    const space = testSpace('quorum-existing', { TALLY_QUEUE_TYPE: 'quorum' });
    try {
      const workload = generateWorkload({ messages: 500, skus: 50, seed: 22, duplicateRate: 0.02, idPrefix: space.queue });
      // The publisher declares a plain classic queue.
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const daemon = await startDaemon(space.env);
      const warning = await daemon.waitForLog('using it as it is');
      expect(warning).to.include(`"queue":"${space.queue}"`);
      expect(warning).to.include('"requested":"quorum"');
      expect(warning).to.include('"found":"classic"');
      await waitForReadyBelow(space.queue, 1);
      await sleep(300);
      daemon.child.kill('SIGTERM');
      expect((await daemon.exited).code).to.equal(0);
      expect(await queueType(space.queue)).to.equal('classic');
      expect(compare(await countsOf(space.prefix), workload.truth).exact).to.equal(true);
    } finally {
      await cleanup(space);
    }
  });

  it('finds the type of an existing quorum queue declared with other arguments, and leaves it as it is', async () => {
    const space = testSpace('quorum-probe');
    const log = createLogger('silent', { component: 'test' });
    const connection = await amqp.connect(AMQP_URL);
    try {
      const names = { queue: space.queue, deadLetterQueue: `${space.queue}.dead` };
      const [created] = await declareTallyQueues(connection, { ...names, queueType: 'quorum', deliveryLimit: 5 }, log);
      expect(created).to.deep.include({ asRequested: true, type: 'quorum' });
      const [asClassic, deadAsClassic] = await declareTallyQueues(connection, { ...names, queueType: 'classic', deliveryLimit: 5 }, log);
      expect(asClassic).to.deep.include({ asRequested: false, requestedType: 'classic', type: 'quorum' });
      expect(deadAsClassic).to.deep.include({ asRequested: false, type: 'quorum' });
      const [otherLimit] = await declareTallyQueues(connection, { ...names, queueType: 'quorum', deliveryLimit: 9 }, log);
      expect(otherLimit).to.deep.include({ asRequested: false, type: 'quorum' });
      expect(otherLimit!.brokerSays).to.include('x-delivery-limit');
      // Untouched: the original limit still holds (a declaration with it matches).
      const [again] = await declareTallyQueues(connection, { ...names, queueType: 'quorum', deliveryLimit: 5 }, log);
      expect(again!.asRequested).to.equal(true);
      expect(await queueType(space.queue)).to.equal('quorum');
    } finally {
      await connection.close().catch(() => {});
      await cleanup(space);
    }
  });

  it('a crash loop past the delivery limit parks messages in <queue>.dead: every message is counted or there, none dropped', async () => {
    const deliveryLimit = 2;
    const space = testSpace('quorum-loop', {
      TALLY_QUEUE_TYPE: 'quorum',
      TALLY_DELIVERY_LIMIT: String(deliveryLimit),
      TALLY_PREFETCH: '60',
      TALLY_BATCH_SIZE: '20',
      TALLY_WORKERS: '1',
    });
    try {
      await declareAsTally(space, deliveryLimit);
      const workload = generateWorkload({ messages: 600, skus: 60, seed: 23, duplicateRate: 0, idPrefix: space.queue });
      const good = goodMessages(workload.publishes);
      expect(good).to.have.length(600);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });

      // A consumer that dies on its deliveries, more times than the limit allows.
      for (let round = 0; round <= deliveryLimit + 1; round++) expect(await crashingConsumer(space.queue, 40)).to.be.greaterThan(0);
      // Then Tally, SIGKILLed twice mid-stream (after it made progress), then drained.
      let ready = (await queueState(space.queue)).messageCount;
      for (let kill = 0; kill < 2; kill++) {
        const daemon = await startDaemon(space.env);
        await waitForReadyBelow(space.queue, ready - 60);
        expect((await killDaemon(daemon)).signal).to.equal('SIGKILL');
        ready = (await queueState(space.queue)).messageCount;
      }
      await drainWithDaemon(space.env, space.queue);
      await sleep(500);

      const dead = await drainQueue(`${space.queue}.dead`);
      const deadIds = new Set<string>();
      for (const message of dead) {
        const reason = deadLetterReason(message.properties.headers);
        expect(reason.code, JSON.stringify(message.properties.headers)).to.equal('delivery-limit');
        expect(reason.source).to.equal('broker');
        deadIds.add((JSON.parse(message.content.toString('utf8')) as { id?: string }).id ?? String(message.properties.messageId));
      }
      expect(deadIds.size, 'the crash loop parked messages').to.be.greaterThan(0);

      // Counted: every part's marker is there.
      const counted = await withRedis(async (redis) => {
        const { done } = await readMarkers(redis, space.prefix);
        const ids = new Set<string>();
        for (const m of good) {
          const entries = [...new Set(m.changes.filter((c) => c.delta !== 0).map((c) => markerEntry(shardOf(c.sku, 16), m.id)))];
          if (entries.every((entry) => done.has(entry))) ids.add(m.id);
        }
        return ids;
      });
      const accounted = good.filter((m) => counted.has(m.id) || deadIds.has(m.id));
      const neither = good.filter((m) => !counted.has(m.id) && !deadIds.has(m.id)).map((m) => m.id);
      expect(neither, 'messages neither counted nor in <queue>.dead: dropped').to.deep.equal([]);
      expect(accounted.length).to.equal(good.length);
      // Nothing that is not parked is missing from the counts.
      const diff = compare(await countsOf(space.prefix), truthOf(good.filter((m) => !deadIds.has(m.id))));
      expect(diff.below, 'SKUs below the truth of the messages not parked').to.deep.equal([]);
      const both = good.filter((m) => counted.has(m.id) && deadIds.has(m.id)).length;
      const stats = await statsOf(space.prefix);
      console.log(
        `      crash loop, limit ${deliveryLimit}: ${good.length} messages = ${counted.size} counted + ${dead.length} parked in .dead ` +
          `(${both} of them both: counted, then the crash before the ack pushed them past the limit); stats ${JSON.stringify(stats)}`,
      );
    } finally {
      await cleanup(space);
    }
  });
});
