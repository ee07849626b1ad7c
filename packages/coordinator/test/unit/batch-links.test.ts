import { expect } from 'chai';
import { sampledProducerLinks } from '../../src/telemetry/batch-span.js';

const trace = (n: number) => n.toString(16).padStart(32, '0');
const span = (n: number) => n.toString(16).padStart(16, '0');

describe('batch span links (pure)', () => {
  it('keeps every distinct sampled producer context in arrival order, with no cap of its own', () => {
    const headers = Array.from({ length: 300 }, (_, i) => `00-${trace(i + 1)}-${span(i + 1)}-01`);
    const links = sampledProducerLinks([...headers, ...headers.slice(0, 10)]);
    expect(links).to.have.length(300);
    expect(links[0]!.context.traceId).to.equal(trace(1));
    expect(links[299]!.context.traceId).to.equal(trace(300));
  });

  it('leaves out unsampled, missing and hostile headers', () => {
    const links = sampledProducerLinks([
      `00-${trace(1)}-${span(1)}-00`,
      undefined,
      'garbage',
      `00-${'0'.repeat(32)}-${span(2)}-01`,
      `00-${trace(3)}-${'0'.repeat(16)}-01`,
      `00-${trace(4)}-${span(4)}-03`,
      `00-${trace(0xabc5).toUpperCase()}-${span(5)}-01`,
    ]);
    expect(links.map((l) => l.context.traceId)).to.deep.equal([trace(4)]);
  });
});
