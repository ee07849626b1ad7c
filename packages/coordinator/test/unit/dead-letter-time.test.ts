/**
 * The dead-letter time stamp the replay guard reckons from (replay-guard.ts):
 * set by the daemon on every dead letter it publishes (its first attempt's
 * time, kept by a retry), and moved by `tally dead replay` from
 * `x-tally-dead-at` to `x-tally-first-dead-at` on the copy it sends back, so
 * a copy dead-lettered again gets a time of its own and keeps the first.
 */
import { expect } from 'chai';
import type { Channel, ConsumeMessage, GetMessage, Options } from 'amqplib';
import pino from 'pino';
import { DEAD_AT_HEADER, FIRST_DEAD_AT_HEADER, STANDING_COUNTS_HEADER } from '@tally/shared';
import { DeadLetterPublishing } from '../../src/amqp/dead-letter-publishing.js';
import { replayProperties } from '../../src/commands/dead-queue.js';
import type { ChannelLink } from '../../src/pipeline/delivery.js';

const silent = pino({ level: 'silent' });

interface Sent {
  readonly queue: string;
  readonly content: Buffer;
  readonly options: Options.Publish;
}

/** A confirm channel that records each publish and confirms it at once. */
function recordingLink(): { link: ChannelLink; sent: Sent[] } {
  const sent: Sent[] = [];
  const channel = {
    on() {
      return channel;
    },
    sendToQueue(queue: string, content: Buffer, options: Options.Publish, confirmed: (error: unknown) => void) {
      sent.push({ queue, content, options });
      setImmediate(() => confirmed(null));
      return true;
    },
  };
  return { link: { generation: 1, channel: channel as unknown as Channel, alive: true }, sent };
}

function delivery(headers: Record<string, unknown>): ConsumeMessage {
  return {
    content: Buffer.from('{"id":"m-1","changes":[{"sku":"A","delta":1}]}'),
    fields: { deliveryTag: 1, redelivered: false, exchange: '', routingKey: 'q', consumerTag: 'c' },
    properties: { headers, messageId: 'm-1', timestamp: 1_700_000_000, contentType: 'application/json' },
  } as unknown as ConsumeMessage;
}

describe('the dead-letter time stamp', () => {
  it('is set on every dead letter the daemon publishes, the time of its first attempt, with the reason and the source queue', async () => {
    const publishing = new DeadLetterPublishing('q.dead', silent, () => {});
    const { link, sent } = recordingLink();
    const before = Date.now();
    await publishing.publish(link, delivery({ traceparent: 't' }), 'count-refused: ERR (sku "A", key k, delta 1)', 'q');
    const after = Date.now();
    expect(sent).to.have.length(1);
    const headers = sent[0]!.options.headers as Record<string, unknown>;
    expect(sent[0]!.queue).to.equal('q.dead');
    expect(headers[DEAD_AT_HEADER]).to.be.a('number').within(before, after);
    expect(headers).to.include({ 'x-tally-reason': 'count-refused: ERR (sku "A", key k, delta 1)', 'x-tally-source-queue': 'q', traceparent: 't' });
    expect(headers, 'no earlier dead-lettering to carry').to.not.have.property(FIRST_DEAD_AT_HEADER);
  });

  it("keeps the first attempt's time when the publish of the same delivery is retried; another delivery gets its own", async () => {
    const publishing = new DeadLetterPublishing('q.dead', silent, () => {});
    const { link, sent } = recordingLink();
    const message = delivery({});
    await publishing.publish(link, message, 'count-refused: x', 'q');
    await new Promise((resolve) => setTimeout(resolve, 5));
    await publishing.publish(link, message, 'count-refused: x', 'q');
    await publishing.publish(link, delivery({}), 'count-refused: x', 'q');
    const times = sent.map((s) => (s.options.headers as Record<string, unknown>)[DEAD_AT_HEADER] as number);
    expect(times[1], 'a retry keeps the first time').to.equal(times[0]);
    expect(times[2], 'a later delivery is dead-lettered later').to.be.greaterThan(times[0]!);
  });

  it("replaces a replayed copy's x-tally-dead-at with its own time and keeps the x-tally-first-dead-at it carries", async () => {
    const publishing = new DeadLetterPublishing('q.dead', silent, () => {});
    const { link, sent } = recordingLink();
    const replayed = { [FIRST_DEAD_AT_HEADER]: 1_700_000_000_000, 'x-tally-replayed-reason': 'count-refused' };
    const before = Date.now();
    await publishing.publish(link, delivery({ ...replayed, [DEAD_AT_HEADER]: 1_600_000_000_000 }), 'count-refused: again', 'q');
    const headers = sent[0]!.options.headers as Record<string, unknown>;
    expect(headers[DEAD_AT_HEADER]).to.be.at.least(before);
    expect(headers[FIRST_DEAD_AT_HEADER]).to.equal(1_700_000_000_000);
  });

  it('is removed from the copy a replay sends back, and carried as x-tally-first-dead-at', () => {
    const dead = {
      properties: {
        headers: {
          'x-tally-reason': 'count-refused: x',
          'x-tally-source-queue': 'q.3',
          [DEAD_AT_HEADER]: 1_700_000_005_000,
          // Forced past it: the operator subtracted what stood; a copy refused again gets the daemon's own anew.
          [STANDING_COUNTS_HEADER]: '{"k":"5"}',
          traceparent: 't',
        },
        messageId: 'm-1',
        timestamp: 1_700_000_000,
        contentType: 'application/json',
      },
    } as unknown as GetMessage;
    const copy = replayProperties(dead, 'count-refused');
    expect(copy.headers).to.deep.equal({ traceparent: 't', 'x-tally-replayed-reason': 'count-refused', [FIRST_DEAD_AT_HEADER]: 1_700_000_005_000 });
    expect(copy).to.include({ messageId: 'm-1', timestamp: 1_700_000_000, contentType: 'application/json', persistent: true, mandatory: true });
    // The dead letter itself is untouched: a replay that fails leaves it as it was.
    expect(dead.properties.headers).to.have.property(DEAD_AT_HEADER, 1_700_000_005_000);
  });

  it('keeps the earlier of the two times across rounds, and carries nothing when the dead letter has no time', () => {
    const again = { properties: { headers: { [DEAD_AT_HEADER]: 1_700_000_009_000, [FIRST_DEAD_AT_HEADER]: 1_700_000_001_000 } } } as unknown as GetMessage;
    expect(replayProperties(again, 'count-refused').headers).to.deep.equal({
      'x-tally-replayed-reason': 'count-refused',
      [FIRST_DEAD_AT_HEADER]: 1_700_000_001_000,
    });
    const parked = { properties: { headers: { 'x-death': [] } } } as unknown as GetMessage;
    expect(replayProperties(parked, 'delivery-limit').headers).to.deep.equal({ 'x-death': [], 'x-tally-replayed-reason': 'delivery-limit' });
    const bare = { properties: {} } as unknown as GetMessage;
    expect(replayProperties(bare, 'malformed-json').headers).to.deep.equal({ 'x-tally-replayed-reason': 'malformed-json' });
  });
});
