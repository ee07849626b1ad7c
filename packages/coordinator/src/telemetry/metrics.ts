/**
 * Metrics through the OpenTelemetry metrics API, read by a Prometheus
 * exporter mounted on the daemon's HTTP endpoint. Names follow the messaging
 * conventions where one exists; Tally's own figures live under `tally.*`.
 * Prometheus turns dots into underscores and adds `_total` to counters
 * (`tally.duplicates` -> `tally_duplicates_total`): operators alert on
 * those names, so they are part of the contract (README, "Metrics").
 */
import type { Attributes, Meter } from '@opentelemetry/api';
import { COUNTER_NAMES, COUNTERS, type BatchResult, type CounterValues, type TallyMode } from '@tally/shared';

export interface MetricSources {
  /** Counters since this process started. */
  readonly counters: () => CounterValues;
  readonly inFlight: () => number;
  readonly shardDepths: () => number[];
  readonly connections: () => { amqp: boolean; redis: boolean };
}

const SIZE_BUCKETS = [1, 10, 50, 100, 200, 500, 1000, 2000, 5000, 10000];
const SECONDS_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** Counters that cannot happen in a mode are not exported at all, rather than as a misleading 0. */
export function counterApplies(name: string, mode: TallyMode): boolean {
  return !(mode === 'atomic' && name === 'occupation_failures');
}

export class DaemonMetrics {
  private readonly base: Attributes;
  private readonly batchSize;
  private readonly flushDuration;
  private readonly crashWindow;
  private readonly processDuration;
  private readonly messageAge;

  constructor(meter: Meter, options: { queue: string; mode: TallyMode; virtualShards: number }, sources: MetricSources) {
    this.base = { 'messaging.system': 'rabbitmq', 'messaging.destination.name': options.queue };
    const base = this.base;

    meter
      .createObservableCounter('messaging.client.consumed.messages', { description: 'Deliveries consumed, redeliveries included', unit: '{message}' })
      .addCallback((result) => result.observe(sources.counters().received, { ...base, 'messaging.operation.name': 'consume' }));
    for (const name of COUNTER_NAMES) {
      if (!counterApplies(name, options.mode)) continue;
      meter
        .createObservableCounter(`tally.${name}`, { description: COUNTERS[name] })
        .addCallback((result) => result.observe(sources.counters()[name], base));
    }
    meter
      .createObservableGauge('tally.info', { description: 'Constant 1, labelled with the mode and the layout; in atomic mode occupation failures cannot happen and are not exported' })
      .addCallback((result) =>
        result.observe(1, {
          ...base,
          'tally.mode': options.mode,
          'tally.virtual_shards': options.virtualShards,
          'tally.occupation_failures': options.mode === 'atomic' ? 'not applicable' : 'counted',
        }),
      );
    meter
      .createObservableGauge('tally.deliveries.in_flight', { description: 'Messages received and not yet acked', unit: '{message}' })
      .addCallback((result) => result.observe(sources.inFlight(), base));
    meter
      .createObservableGauge('tally.shard.queue_depth', { description: 'Parts waiting in each virtual shard lane', unit: '{part}' })
      .addCallback((result) => sources.shardDepths().forEach((depth, shard) => result.observe(depth, { ...base, 'tally.shard': shard })));
    meter
      .createObservableGauge('tally.connection.up', { description: '1 while the connection to the server is usable, else 0' })
      .addCallback((result) => {
        const { amqp, redis } = sources.connections();
        result.observe(amqp ? 1 : 0, { ...base, 'server.type': 'rabbitmq' });
        result.observe(redis ? 1 : 0, { ...base, 'server.type': 'redis' });
      });

    this.batchSize = meter.createHistogram('tally.batch.size', {
      description: 'Parts per shard batch',
      unit: '{part}',
      advice: { explicitBucketBoundaries: SIZE_BUCKETS },
    });
    this.flushDuration = meter.createHistogram('tally.flush.duration', {
      description: 'From a shard batch leaving its lane to its result: pre-check, write, occupy',
      unit: 's',
      advice: { explicitBucketBoundaries: SECONDS_BUCKETS },
    });
    this.crashWindow = meter.createHistogram('tally.crash_window.duration', {
      description: 'From the start of the count write to the end of marker occupation',
      unit: 's',
      advice: { explicitBucketBoundaries: SECONDS_BUCKETS },
    });
    this.processDuration = meter.createHistogram('messaging.process.duration', {
      description: 'From delivery to ack',
      unit: 's',
      advice: { explicitBucketBoundaries: SECONDS_BUCKETS },
    });
    this.messageAge = meter.createHistogram('tally.message.age', {
      description: 'End-to-end age at ack: ack time minus the message timestamp property, when present',
      unit: 's',
      advice: { explicitBucketBoundaries: [...SECONDS_BUCKETS, 30, 60, 300] },
    });
  }

  recordBatch(parts: number, elapsedMs: number, result: BatchResult): void {
    this.batchSize.record(parts, this.base);
    this.flushDuration.record(elapsedMs / 1000, this.base);
    const window = result.timings.writeMs + result.timings.occupyMs;
    if (window > 0) this.crashWindow.record(window / 1000, this.base);
  }

  /**
   * @param receivedAt performance.now() at delivery
   * @param publishedAt epoch ms of the message timestamp, if any
   */
  recordAck(receivedAt: number, publishedAt: number | undefined, wallNow: number, monotonicNow: number): void {
    this.processDuration.record((monotonicNow - receivedAt) / 1000, { ...this.base, 'messaging.operation.type': 'process' });
    if (publishedAt !== undefined) this.messageAge.record(Math.max(0, wallNow - publishedAt) / 1000, this.base);
  }
}

/**
 * The AMQP `timestamp` property is seconds by the spec, milliseconds by
 * common practice. Values below 10^11 are read as seconds (10^11 ms is 1973).
 */
export function timestampToMs(timestamp: unknown): number | undefined {
  if (typeof timestamp !== 'number' || !Number.isFinite(timestamp) || timestamp <= 0) return undefined;
  return timestamp < 1e11 ? timestamp * 1000 : timestamp;
}
