import { expect } from 'chai';
import { FOREIGN_ID_HEADER, FOREIGN_SHAPE_MAPPING, foreignBody, generateWorkload, publishAll, type Publish } from '@tally/workload';
import { BAD_MESSAGE_REASONS } from '@tally/shared';
import {
  cleanup,
  compare,
  countsOf,
  drainQueue,
  drainWithDaemon,
  runRefusedStart,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  waitForReadyEmpty,
  AMQP_URL,
} from './harness.js';
import { tallyCli } from './fleet-helpers.js';
import type { DeadListReport } from '../../src/commands/dead.js';

/** The variable an operator sets to count the foreign shape, exactly as docs/operations.md and the README write it. */
const MAPPING_ENV = { TALLY_MESSAGE_MAPPING: JSON.stringify(FOREIGN_SHAPE_MAPPING) };

describe("a message shape of the user's own, through TALLY_MESSAGE_MAPPING (integration)", function () {
  this.timeout(240_000);

  it('counts the foreign shape exactly under warehouse:sku, ids in the body or the header, duplicates caught', async () => {
    const space = testSpace('foreign', MAPPING_ENV);
    try {
      const workload = generateWorkload({
        shape: 'foreign',
        messages: 8_000,
        skus: 500,
        seed: 81,
        duplicateRate: 0.03,
        minDelta: -3,
        maxDelta: 9,
        types: ['sale', 'return'],
        idPrefix: space.queue,
      });
      expect(workload.duplicates).to.equal(240);
      // A message whose every qty is 0 is acked as empty, its copies too: neither counted nor a duplicate.
      const empty = (p: Publish) => (JSON.parse(p.body.toString()) as { lines: Array<{ qty: number }> }).lines.every((line) => line.qty === 0);
      const emptyGood = workload.publishes.filter((p) => p.kind === 'good' && empty(p)).length;
      const emptyCopies = workload.publishes.filter((p) => p.kind === 'duplicate' && empty(p)).length;
      expect(emptyGood, 'negative, zero and positive quantities').to.be.greaterThan(0);
      const inHeader = workload.publishes.filter((p) => p.headers?.[FOREIGN_ID_HEADER] !== undefined);
      expect(inHeader.length, 'some ids travel only in the header').to.be.greaterThan(500);
      const daemon = await startDaemon(space.env);
      await daemon.waitForLog('messages read through TALLY_MESSAGE_MAPPING');
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      expect((await stopDaemon(daemon)).code, 'SIGTERM exits 0').to.equal(0);

      const counts = await countsOf(space.prefix);
      const diff = compare(counts, workload.truth);
      expect(diff.below, 'SKUs below the truth').to.deep.equal([]);
      expect([...diff.excess], 'SKUs above the truth').to.deep.equal([]);
      expect(
        [...counts.keys()].every((sku) => /^WH[1-4]:SKU-\d{6}$/.test(sku)),
        'counted under the joined SKU',
      ).to.equal(true);
      expect(workload.truth.size).to.be.greaterThan(1_500);

      const stats = await statsOf(space.prefix);
      expect(stats.received).to.equal(8_240);
      expect(stats.duplicates, 'duplicates caught = duplicates injected (header ids included)').to.equal(240 - emptyCopies);
      expect(stats.counted).to.equal(8_000 - emptyGood);
      expect(stats.empty).to.equal(emptyGood + emptyCopies);
      expect(stats.dead_lettered).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });

  it('dead-letters bad foreign messages with the code and the mapped path in x-tally-reason, and counts the good ones', async () => {
    const space = testSpace('foreign-dead', { ...MAPPING_ENV, TALLY_MAX_MESSAGE_BYTES: '4096' });
    try {
      const workload = generateWorkload({ shape: 'foreign', messages: 2_000, skus: 200, seed: 82, badRate: 0.05, idPrefix: space.queue, maxBytes: 4096 });
      expect(workload.bad).to.equal(100);
      expect(workload.badReasons.size, 'the foreign corpus exercises many reasons').to.be.at.least(12);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const exits = await drainWithDaemon(space.env, space.queue);
      expect(exits.map((e) => e.code)).to.deep.equal(exits.map(() => 0));

      // `tally dead list` reads each dead letter's id where the mapping says, as the daemon did.
      const listed = await tallyCli(space.env, 'dead', 'list', '--json', '--limit', '1000');
      expect(listed.code, listed.stderr).to.equal(0);
      const entries = (JSON.parse(listed.stdout) as DeadListReport).messages;
      const dead = await drainQueue(`${space.queue}.dead`);
      expect(dead.length, 'exactly the bad messages').to.equal(workload.bad);
      expect(entries.map((e) => e.position)).to.deep.equal(dead.map((_, i) => i));
      let named = 0;
      dead.forEach((message, i) => {
        let eventId: unknown;
        try {
          eventId = (JSON.parse(message.content.toString('utf8')) as { eventId?: unknown }).eventId;
        } catch {
          eventId = undefined;
        }
        if (typeof eventId === 'string' && eventId !== '') {
          expect(entries[i]!.id, `dead letter ${i}`).to.equal(eventId.slice(0, 256) + (eventId.length > 256 ? '…' : ''));
          named++;
        }
      });
      expect(named, 'dead letters listed under their mapped id').to.be.greaterThan(50);
      const expected = new Map<string, Publish>();
      for (const p of workload.publishes) if (p.kind === 'bad') expected.set(p.body.toString('base64'), p);
      let withPath = 0;
      for (const message of dead) {
        const header = String(message.properties.headers?.['x-tally-reason'] ?? '');
        const code = header.split(':')[0]!;
        expect(BAD_MESSAGE_REASONS as readonly string[]).to.include(code);
        const wanted = expected.get(message.content.toString('base64'));
        expect(wanted, 'the body is kept byte for byte').to.not.equal(undefined);
        expect(code, header).to.equal(wanted!.reason);
        if (wanted!.path !== undefined) {
          // `invalid-delta: /lines/3/qty must be an integer, got "2"`: the mapped path, not changes[3].delta.
          expect(header, 'the reason names the mapped path').to.include(` ${wanted!.path}`);
          expect(header).to.not.match(/changes\[/);
          withPath++;
        }
      }
      expect(withPath).to.be.greaterThan(60);
      const example = dead.map((m) => String(m.properties.headers?.['x-tally-reason'])).find((h) => h.startsWith('invalid-delta: /lines/3/'));
      expect(example).to.equal('invalid-delta: /lines/3/qty must be an integer, got "2"');

      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.dead_lettered).to.equal(workload.bad);
      expect(stats.counted).to.equal(workload.good);
    } finally {
      await cleanup(space);
    }
  });

  it('takes the id from the header alone: copies of one header id count once, a message with no id anywhere is dead-lettered', async () => {
    const space = testSpace('foreign-header', MAPPING_ENV);
    try {
      const body = foreignBody(null, 'WH3', [{ sku: 'A-1', delta: -2, type: 'sale' }]);
      const other = foreignBody(null, 'WH3', [{ sku: 'A-1', delta: 5, type: 'restock' }]);
      const noId = foreignBody(null, 'WH3', [{ sku: 'NO-ID', delta: 7 }]);
      const { default: amqp } = await import('amqplib');
      const connection = await amqp.connect(AMQP_URL);
      const channel = await connection.createConfirmChannel();
      await channel.assertQueue(space.queue, { durable: true });
      // Three copies of e-81 (the same header id, even under another messageId property), one e-82, one with no id.
      for (const messageId of [undefined, 'ignored-1', 'ignored-2']) {
        channel.sendToQueue(space.queue, body, {
          persistent: true,
          headers: { [FOREIGN_ID_HEADER]: `${space.queue}-e-81` },
          ...(messageId ? { messageId } : {}),
        });
      }
      channel.sendToQueue(space.queue, other, { persistent: true, headers: { [FOREIGN_ID_HEADER]: `${space.queue}-e-82` } });
      channel.sendToQueue(space.queue, noId, { persistent: true, messageId: 'a-property-is-not-the-mapped-id' });
      await channel.waitForConfirms();
      await connection.close();

      await drainWithDaemon(space.env, space.queue);
      const counts = await countsOf(space.prefix);
      expect(Object.fromEntries(counts)).to.deep.equal({ 'WH3:A-1': 3 });
      const stats = await statsOf(space.prefix);
      expect(stats.duplicates).to.equal(2);
      expect(stats.counted).to.equal(2);
      const dead = await drainQueue(`${space.queue}.dead`);
      expect(dead.map((m) => String(m.properties.headers?.['x-tally-reason']))).to.deep.equal([`missing-id: no /eventId and no header ${FOREIGN_ID_HEADER}`]);
      expect(dead[0]!.content.equals(noId)).to.equal(true);
    } finally {
      await cleanup(space);
    }
  });

  it('refuses to start on a bad mapping: exit 2, one line naming the variable and the key', async () => {
    const space = testSpace('foreign-bad-mapping', { TALLY_MESSAGE_MAPPING: JSON.stringify({ ...FOREIGN_SHAPE_MAPPING, delta: 'qty' }) });
    const refused = await runRefusedStart(space.env);
    expect(refused.code).to.equal(2);
    expect(refused.stderrLines).to.have.length(1);
    expect(refused.stderr).to.match(/TALLY_MESSAGE_MAPPING: delta: /);
  });
});
