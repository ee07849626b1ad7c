import { expect } from 'chai';
import type { Attributes } from '@opentelemetry/api';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { zeroCounters } from '@tally/shared';
import { seededRandom } from '@tally/workload';
import { HttpEndpoints } from '../../src/telemetry/http-endpoints.js';
import { LocalHistogram, LocalHistogramProducer } from '../../src/telemetry/local-histograms.js';
import { DaemonMetrics, MESSAGE_AGE, PROCESS_DURATION, prometheusViews } from '../../src/telemetry/metrics.js';
import { createMetricsExport, METER_NAME } from '../../src/telemetry/metrics-export.js';
import { processAttributes, queueAttributes } from '../../src/telemetry/queue-attributes.js';

const QUEUE = 'inventory.changes';

/** Serves an exporter on loopback, scrapes /metrics once, closes. */
async function scrape(exporter: PrometheusExporter): Promise<string> {
  const endpoints = new HttpEndpoints(exporter, () => ({ ready: true, detail: {} }));
  const port = await endpoints.listen(0, '127.0.0.1');
  try {
    return await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  } finally {
    await endpoints.close();
  }
}

/** The lines of one metric family (HELP, UNIT, TYPE and its samples), or [] when it is absent. */
function family(text: string, name: string): string[] {
  return text
    .split('\n')
    .filter(
      (line) => line.startsWith(`# HELP ${name} `) || line.startsWith(`# UNIT ${name} `) || line.startsWith(`# TYPE ${name} `) || line.startsWith(`${name}_`),
    );
}

interface Ack {
  receivedAt: number;
  publishedAt: number | undefined;
  wallNow: number;
  monotonicNow: number;
}

/** Acks whose durations and ages hit every bucket, every boundary exactly, both ends, the dropped values and the absent timestamp. */
function acks(): Ack[] {
  const wallNow = 1_764_540_000_000;
  const out: Ack[] = [];
  const add = (durationMs: number, ageMs: number | undefined) =>
    out.push({ receivedAt: 1_000, monotonicNow: 1_000 + durationMs, wallNow, publishedAt: ageMs === undefined ? undefined : wallNow - ageMs });
  for (const bound of MESSAGE_AGE.boundaries) add(bound * 1000, bound * 1000); // exactly on each upper bound (inclusive)
  for (const bound of MESSAGE_AGE.boundaries) add(bound * 1000 * 1.0001, bound * 1000 * 1.0001); // just above it
  add(0, 0);
  add(20_000, 400_000); // beyond the last bound: +Inf
  add(3, -5_000); // a timestamp in the future reads as age 0
  add(-1, undefined); // a negative duration is dropped, as the SDK drops it; no timestamp: no age
  const random = seededRandom(42);
  for (let i = 0; i < 2_000; i++) add(-Math.log(1 - random()) * 40, random() < 0.2 ? undefined : -Math.log(1 - random()) * 4_000);
  return out;
}

/** The histograms as they were made before (SDK instruments, renamed by the views), to compare the exposition with. */
function referenceExport(): { exporter: PrometheusExporter; record(ack: Ack): void } {
  const exporter = new PrometheusExporter({ preventServerStart: true });
  const provider = new MeterProvider({ resource: resourceFromAttributes({ 'service.name': 'tally' }), readers: [exporter], views: prometheusViews() });
  const meter = provider.getMeter(METER_NAME);
  const histogram = (spec: typeof PROCESS_DURATION | typeof MESSAGE_AGE) =>
    meter.createHistogram(spec.name, { description: spec.description, unit: 's', advice: { explicitBucketBoundaries: [...spec.boundaries] } });
  const processDuration = histogram(PROCESS_DURATION);
  const messageAge = histogram(MESSAGE_AGE);
  const processBase: Attributes = processAttributes(QUEUE);
  const base: Attributes = queueAttributes(QUEUE);
  return {
    exporter,
    record: ({ receivedAt, publishedAt, wallNow, monotonicNow }) => {
      processDuration.record((monotonicNow - receivedAt) / 1000, processBase);
      if (publishedAt !== undefined) messageAge.record(Math.max(0, wallNow - publishedAt) / 1000, base);
    },
  };
}

async function daemonExport(): Promise<{ exporter: PrometheusExporter; metrics: DaemonMetrics }> {
  const { exporter, provider, histograms } = await createMetricsExport();
  const metrics = new DaemonMetrics(
    provider.getMeter(METER_NAME),
    { queue: QUEUE, mode: 'two-step', virtualShards: 16 },
    {
      counters: () => zeroCounters(),
      inFlight: () => 0,
      shardDepths: () => [],
      connections: () => ({ amqp: true, redis: true }),
    },
    histograms,
  );
  return { exporter, metrics };
}

const FAMILIES = ['messaging_process_duration_seconds', 'tally_message_age_seconds'];

describe('per-delivery histograms outside the SDK (local-histograms.ts)', () => {
  it('scrape exactly as the SDK instruments did: same HELP, UNIT, TYPE, labels, bucket counts, _count and _sum', async () => {
    const reference = referenceExport();
    const { exporter, metrics } = await daemonExport();
    for (const ack of acks()) {
      reference.record(ack);
      metrics.recordAck(ack.receivedAt, ack.publishedAt, ack.wallNow, ack.monotonicNow);
    }
    const [expected, actual] = await Promise.all([scrape(reference.exporter), scrape(exporter)]);
    for (const name of FAMILIES) {
      const want = family(expected, name);
      expect(want.length, `${name} in the reference`).to.be.greaterThan(10);
      expect(family(actual, name), name).to.deep.equal(want);
    }
    // Each family once: the SDK no longer makes them too.
    for (const name of FAMILIES) expect(actual.split('\n').filter((l) => l === `# TYPE ${name} histogram`)).to.have.length(1);
  });

  it('counts each record in the first bucket whose bound is >= it, and only there (against a linear scan)', async () => {
    const { exporter, metrics } = await daemonExport();
    const all = acks();
    for (const ack of all) metrics.recordAck(ack.receivedAt, ack.publishedAt, ack.wallNow, ack.monotonicNow);
    const text = await scrape(exporter);
    const check = (name: string, boundaries: readonly number[], values: number[]) => {
      const kept = values.filter((v) => v >= 0);
      const bounds = [...boundaries, Infinity];
      const cumulative = bounds.map((bound) => kept.filter((v) => v <= bound).length);
      const samples = new Map(
        [...text.matchAll(new RegExp(`^${name}_bucket\\{[^}]*le="([^"]+)"[^}]*\\} (\\S+)$`, 'gm'))].map(([, le, value]) => [le!, Number(value)]),
      );
      expect([...samples.keys()], `${name} le labels`).to.deep.equal(bounds.map((b) => (b === Infinity ? '+Inf' : String(b))));
      expect([...samples.values()], `${name} cumulative buckets`).to.deep.equal(cumulative);
      const count = Number(new RegExp(`^${name}_count\\{[^}]*\\} (\\S+)$`, 'm').exec(text)?.[1]);
      const sum = Number(new RegExp(`^${name}_sum\\{[^}]*\\} (\\S+)$`, 'm').exec(text)?.[1]);
      expect(count, `${name}_count`).to.equal(kept.length);
      expect(sum, `${name}_sum`).to.equal(kept.reduce((a, b) => a + b, 0));
    };
    check(
      'messaging_process_duration_seconds',
      PROCESS_DURATION.boundaries,
      all.map((a) => (a.monotonicNow - a.receivedAt) / 1000),
    );
    check(
      'tally_message_age_seconds',
      MESSAGE_AGE.boundaries,
      all.filter((a) => a.publishedAt !== undefined).map((a) => Math.max(0, a.wallNow - a.publishedAt!) / 1000),
    );
    expect(text).to.match(
      /^messaging_process_duration_seconds_count\{messaging_system="rabbitmq",messaging_destination_name="inventory\.changes",messaging_operation_type="process",otel_scope_name="tally"\} \d+$/m,
    );
    expect(text).to.match(
      /^tally_message_age_seconds_count\{messaging_system="rabbitmq",messaging_destination_name="inventory\.changes",otel_scope_name="tally"\} \d+$/m,
    );
  });

  it('exports no family before the first record, as the SDK does, and each one from its first record', async () => {
    const { exporter, metrics } = await daemonExport();
    const before = await scrape(exporter);
    for (const name of FAMILIES) expect(family(before, name), name).to.deep.equal([]);
    metrics.recordAck(0, undefined, 0, 2);
    const after = await scrape(exporter);
    expect(family(after, 'messaging_process_duration_seconds')).to.include('# TYPE messaging_process_duration_seconds histogram');
    expect(family(after, 'tally_message_age_seconds'), 'no timestamp yet').to.deep.equal([]);
  });

  it('keeps counting while a collect is serialized: a collected point is a copy', async () => {
    const producer = new LocalHistogramProducer({ name: 'test' }, resourceFromAttributes({}));
    const histogram: LocalHistogram = producer.create({ name: 'h', description: 'd', unit: 's', boundaries: [1, 2], attributes: {} });
    histogram.record(1.5);
    const first = (await producer.collect()).resourceMetrics.scopeMetrics[0]!.metrics[0]!;
    histogram.record(0.5);
    histogram.record(Number.NaN);
    histogram.record(-1);
    const second = (await producer.collect()).resourceMetrics.scopeMetrics[0]!.metrics[0]!;
    expect(first.dataPoints[0]!.value).to.deep.include({ count: 1, sum: 1.5, min: 1.5, max: 1.5 });
    expect((first.dataPoints[0]!.value as { buckets: { counts: number[] } }).buckets.counts).to.deep.equal([0, 1, 0]);
    expect(second.dataPoints[0]!.value).to.deep.include({ count: 2, sum: 2, min: 0.5, max: 1.5 });
    expect((second.dataPoints[0]!.value as { buckets: { counts: number[] } }).buckets.counts).to.deep.equal([1, 1, 0]);
    for (const value of [0, 1, 2, 2.0000001, 1e300]) histogram.record(value);
    const third = (await producer.collect()).resourceMetrics.scopeMetrics[0]!.metrics[0]!;
    expect((third.dataPoints[0]!.value as { buckets: { counts: number[] } }).buckets.counts, 'bounds are inclusive upper bounds').to.deep.equal([3, 2, 2]);
    expect(() => producer.create({ name: 'h', description: 'd', unit: 's', boundaries: [1], attributes: {} })).to.throw(RangeError);
    expect(() => new LocalHistogram({ name: 'x', description: 'd', unit: 's', boundaries: [2, 1], attributes: {} })).to.throw(RangeError);
  });
});
