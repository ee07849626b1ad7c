import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { BAD_MESSAGE_REASONS } from '@tally/shared';
import { cleanup, compare, countsOf, drainQueue, drainWithDaemon, statsOf, testSpace, AMQP_URL } from './harness.js';

describe('dead-lettering (integration)', function () {
  this.timeout(120_000);

  it('sends every bad message to <queue>.dead with its reason, keeps its body, and still counts every good one', async () => {
    const space = testSpace('dead', { TALLY_MAX_MESSAGE_BYTES: '4096' });
    try {
      const workload = generateWorkload({ messages: 3_000, skus: 300, seed: 21, duplicateRate: 0.02, badRate: 0.05, idPrefix: space.queue, maxBytes: 4096 });
      expect(workload.bad).to.equal(150);
      expect(workload.badReasons.size, 'the corpus exercises many reasons').to.be.at.least(12);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const exits = await drainWithDaemon(space.env, space.queue);
      expect(exits.map((e) => e.code)).to.deep.equal(exits.map(() => 0));

      const dead = await drainQueue(`${space.queue}.dead`);
      expect(dead.length, 'exactly the bad messages').to.equal(workload.bad);
      const expected = new Map<string, string>();
      for (const p of workload.publishes) if (p.kind === 'bad') expected.set(p.body.toString('base64'), p.reason!);
      const seenReasons = new Map<string, number>();
      for (const message of dead) {
        const header = String(message.properties.headers?.['x-tally-reason'] ?? '');
        const code = header.split(':')[0]!;
        expect(BAD_MESSAGE_REASONS as readonly string[]).to.include(code);
        const wanted = expected.get(message.content.toString('base64'));
        expect(wanted, 'the body is kept byte for byte').to.not.equal(undefined);
        expect(code, `reason for ${message.content.toString().slice(0, 60)}`).to.equal(wanted);
        expect(header.length, 'the reason says what was wrong').to.be.greaterThan(code.length + 2);
        seenReasons.set(code, (seenReasons.get(code) ?? 0) + 1);
      }
      expect(Object.fromEntries(seenReasons)).to.deep.equal(Object.fromEntries(workload.badReasons));

      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.dead_lettered).to.equal(workload.bad);
      expect(stats.counted).to.equal(workload.good);
    } finally {
      await cleanup(space);
    }
  });

  it('dead-letters a message with no id and no messageId property instead of counting it (invariant 5)', async () => {
    const space = testSpace('noid');
    try {
      const body = Buffer.from(JSON.stringify({ changes: [{ sku: 'NOID-1', delta: 5 }] }));
      const good = Buffer.from(JSON.stringify({ changes: [{ sku: 'NOID-2', delta: 7 }] }));
      const { default: amqp } = await import('amqplib');
      const connection = await amqp.connect(AMQP_URL);
      const channel = await connection.createConfirmChannel();
      await channel.assertQueue(space.queue, { durable: true });
      channel.sendToQueue(space.queue, body, { persistent: true });
      channel.sendToQueue(space.queue, good, { persistent: true, messageId: 'has-a-property-id' });
      await channel.waitForConfirms();
      await connection.close();

      await drainWithDaemon(space.env, space.queue);
      const dead = await drainQueue(`${space.queue}.dead`);
      expect(dead).to.have.length(1);
      expect(String(dead[0]!.properties.headers?.['x-tally-reason'])).to.match(/^missing-id: /);
      expect(dead[0]!.content.equals(body)).to.equal(true);
      const counts = await countsOf(space.prefix);
      expect(counts.get('NOID-1'), 'never counted').to.equal(undefined);
      expect(counts.get('NOID-2'), 'the messageId property is an id').to.equal(7);
    } finally {
      await cleanup(space);
    }
  });
});
