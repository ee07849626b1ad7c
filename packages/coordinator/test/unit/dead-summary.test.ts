import { expect } from 'chai';
import { parseMessageMapping } from '@tally/shared';
import { describeDeadLetter, DeadLetterSummary, idOf, parseLimitFlag, parseReasonFlag, reasonOf } from '../../src/commands/dead-summary.js';

const view = (body: string | Buffer, headers?: Record<string, unknown>, messageId?: unknown) => ({
  content: Buffer.isBuffer(body) ? body : Buffer.from(body),
  properties: { headers, messageId },
});

describe('dead-letter summary (pure)', () => {
  it('reads the reason code and detail of x-tally-reason, string or bytes', () => {
    expect(reasonOf({ 'x-tally-reason': 'oversized-body: the body is 300 bytes' })).to.deep.equal({
      reason: 'oversized-body',
      detail: 'the body is 300 bytes',
    });
    expect(reasonOf({ 'x-tally-reason': Buffer.from('missing-id: no id') })).to.deep.equal({ reason: 'missing-id', detail: 'no id' });
    expect(reasonOf({ 'x-tally-reason': 'malformed-json' }).reason).to.equal('malformed-json');
  });

  it("reads the broker's reason when Tally wrote none, so --reason delivery-limit selects the messages it parked", () => {
    const parked = { 'x-death': [{ count: 1, reason: 'delivery_limit', queue: 'q' }], 'x-first-death-reason': 'delivery_limit', 'x-first-death-queue': 'q' };
    expect(reasonOf(parked).reason).to.equal('delivery-limit');
    expect(reasonOf({ 'x-first-death-reason': Buffer.from('expired') }).reason).to.equal('expired');
    expect(parseReasonFlag('delivery-limit')).to.equal('delivery-limit');
    expect(parseReasonFlag('maxlen')).to.equal('maxlen');
  });

  it('calls anything else unknown: absent, not a string, not one of the stable codes', () => {
    for (const headers of [
      undefined,
      {},
      { 'x-tally-reason': 42 },
      { 'x-tally-reason': { a: 1 } },
      { 'x-tally-reason': 'rm -rf: /' },
      { 'x-tally-reason': '__proto__: x' },
    ]) {
      expect(reasonOf(headers as Record<string, unknown> | undefined).reason, JSON.stringify(headers)).to.equal('unknown');
    }
  });

  it('finds the id in the body, else in messageId; hostile bodies give null, long ids are cut', () => {
    expect(idOf(view('{"id":"a-1","changes":[]}'))).to.equal('a-1');
    expect(idOf(view('{"changes":[]}', undefined, 'prop-7'))).to.equal('prop-7');
    expect(idOf(view('{"id":5}', undefined, 'prop-8'))).to.equal('prop-8');
    for (const body of ['', 'not json', '[1,2]', 'null', '{"id":""}', Buffer.from([0xff, 0xfe])]) expect(idOf(view(body))).to.equal(null);
    expect(idOf(view(JSON.stringify({ id: 'x'.repeat(1000) })))!.length).to.equal(257);
    expect(idOf(view('{"id":"big","pad":"' + 'p'.repeat(2_000_000) + '"}', undefined, 'prop'))).to.equal('prop');
  });

  it("under TALLY_MESSAGE_MAPPING reads the id where the daemon did: a body path, then a header; the contract's `id` is not one", () => {
    const mapping = parseMessageMapping(
      'TALLY_MESSAGE_MAPPING',
      JSON.stringify({ id: ['/eventId', 'header:x-event-id'], changes: '/lines', sku: '0/product/sku', delta: '0/qty' }),
    );
    expect(idOf(view('{"eventId":"e-81","lines":[]}'), mapping)).to.equal('e-81');
    // A bad body (why it is dead) still shows its id.
    expect(idOf(view('{"eventId":"e-82","lines":"oops"}'), mapping)).to.equal('e-82');
    expect(idOf(view('not json', { 'x-event-id': Buffer.from('e-83') }), mapping)).to.equal('e-83');
    expect(idOf(view('{"eventId":7}'), mapping)).to.equal('7');
    expect(idOf(view('{"id":"contract-1"}', undefined, 'prop-1'), mapping), 'neither /eventId nor the header').to.equal(null);
    expect(describeDeadLetter(view('{"eventId":"e-84"}', { 'x-tally-reason': 'missing-changes: no /lines' }), 3, mapping)).to.include({
      id: 'e-84',
      reason: 'missing-changes',
    });
  });

  it('counts every message by reason and keeps the first N that match the filter, in order', () => {
    const summary = new DeadLetterSummary('missing-id', 2);
    const reasons = ['missing-id', 'oversized-body', 'missing-id', 'missing-id', 'weird'];
    reasons.forEach((r, i) => summary.add(describeDeadLetter(view(`{"id":"m${i}"}`, { 'x-tally-reason': `${r}: d` }), i)));
    expect(summary.total).to.equal(5);
    expect(summary.matching).to.equal(3);
    expect(summary.byReason).to.deep.equal({ 'missing-id': 3, 'oversized-body': 1, unknown: 1 });
    expect(summary.messages.map((m) => [m.position, m.id])).to.deep.equal([
      [0, 'm0'],
      [2, 'm2'],
    ]);
  });

  it('validates --reason and --limit with usage errors', () => {
    expect(parseReasonFlag(undefined)).to.equal(null);
    expect(parseReasonFlag('unknown')).to.equal('unknown');
    expect(parseReasonFlag('oversized-body')).to.equal('oversized-body');
    expect(parseReasonFlag('count-refused'), 'a good message Redis refused to count').to.equal('count-refused');
    for (const bad of ['bogus', 'OVERSIZED-BODY', ''])
      expect(() => parseReasonFlag(bad))
        .to.throw()
        .with.property('code', 'TALLY_CLI_USAGE');
    expect(parseLimitFlag(undefined, 20)).to.equal(20);
    expect(parseLimitFlag('7', 20)).to.equal(7);
    for (const bad of ['0', '-1', '1.5', 'ten', ''])
      expect(() => parseLimitFlag(bad, 20))
        .to.throw()
        .with.property('code', 'TALLY_CLI_USAGE');
  });
});
