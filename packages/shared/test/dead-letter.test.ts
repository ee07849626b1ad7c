import { expect } from 'chai';
import { deadLetterReason } from '../src/dead-letter.js';

describe('deadLetterReason', () => {
  it("reads Tally's own reason header", () => {
    expect(deadLetterReason({ 'x-tally-reason': 'malformed-json: Unexpected token' })).to.deep.equal({
      code: 'malformed-json',
      detail: 'Unexpected token',
      source: 'tally',
    });
    expect(deadLetterReason({ 'x-tally-reason': Buffer.from('missing-id: no id') }).code).to.equal('missing-id');
  });

  it("classifies the broker's dead-lettering of a quorum queue past its delivery limit as delivery-limit", () => {
    // The headers RabbitMQ 3.10 sets (seen on this machine's broker).
    const headers = {
      'x-death': [{ count: 1, reason: 'delivery_limit', queue: 'q', exchange: '', 'routing-keys': ['q'] }],
      'x-first-death-exchange': '',
      'x-first-death-queue': 'q',
      'x-first-death-reason': 'delivery_limit',
    };
    expect(deadLetterReason(headers)).to.deep.include({ code: 'delivery-limit', source: 'broker' });
    expect(deadLetterReason(headers).detail).to.include('queue q');
    expect(deadLetterReason({ 'x-first-death-reason': 'expired' }).code).to.equal('expired');
  });

  it('says unknown for anything else, hostile values included', () => {
    for (const headers of [
      undefined,
      {},
      { 'x-first-death-reason': 'toString' },
      { 'x-first-death-reason': 42 },
      { 'x-tally-reason': '' },
      { 'x-tally-reason': { a: 1 } },
    ]) {
      expect(deadLetterReason(headers as Record<string, unknown> | undefined).code).to.equal('unknown');
    }
  });
});
