import { expect } from 'chai';
import { batchSpansSampled, linkShortfallLine, producerLinkShortfall, spanLinkLimit } from '../../src/telemetry/link-limit.js';

describe('producer links against the span link limit (pure)', () => {
  it("reads the SDK's link limit: OTEL_SPAN_LINK_COUNT_LIMIT, or 128", () => {
    expect(spanLinkLimit({})).to.equal(128);
    expect(spanLinkLimit({ OTEL_SPAN_LINK_COUNT_LIMIT: '1000' })).to.equal(1000);
    expect(spanLinkLimit({ OTEL_SPAN_LINK_COUNT_LIMIT: ' 0 ' })).to.equal(0);
    for (const bad of ['', 'lots', '-5', '1.5']) expect(spanLinkLimit({ OTEL_SPAN_LINK_COUNT_LIMIT: bad }), bad).to.equal(128);
  });

  it('knows the samplers that never record a batch span (a root): always_off, parentbased_always_off, a ratio of 0', () => {
    for (const sampler of [undefined, 'always_on', 'parentbased_always_on', 'traceidratio', 'jaeger_remote']) {
      expect(batchSpansSampled({ OTEL_TRACES_SAMPLER: sampler }), String(sampler)).to.equal(true);
    }
    expect(batchSpansSampled({ OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.01' })).to.equal(true);
    expect(batchSpansSampled({ OTEL_TRACES_SAMPLER: 'always_off' })).to.equal(false);
    expect(batchSpansSampled({ OTEL_TRACES_SAMPLER: 'ParentBased_Always_Off' })).to.equal(false);
    expect(batchSpansSampled({ OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '0' })).to.equal(false);
    expect(batchSpansSampled({ OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.0' })).to.equal(false);
  });

  it('finds a shortfall when a batch may hold more messages than its span keeps links, and only then', () => {
    expect(producerLinkShortfall({}, 500)).to.deep.equal({ limit: 128, batchSize: 500 });
    expect(producerLinkShortfall({}, 128)).to.equal(null);
    expect(producerLinkShortfall({ OTEL_SPAN_LINK_COUNT_LIMIT: '500' }, 500)).to.equal(null);
    expect(producerLinkShortfall({ OTEL_SPAN_LINK_COUNT_LIMIT: '499' }, 500)).to.deep.equal({ limit: 499, batchSize: 500 });
    expect(producerLinkShortfall({ OTEL_TRACES_SAMPLER: 'always_off' }, 500), 'nothing sampled, nothing linked').to.equal(null);
  });

  it('says it in one line naming both settings and the value that links every producer', () => {
    const line = linkShortfallLine({ limit: 128, batchSize: 500 });
    expect(line).to.include('TALLY_BATCH_SIZE').and.include('OTEL_SPAN_LINK_COUNT_LIMIT=500').and.include('128');
    expect(line).to.not.include('\n');
  });
});
