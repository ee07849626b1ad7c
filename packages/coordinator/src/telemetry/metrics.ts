/**
 * Metrics through the OpenTelemetry metrics API, read by a Prometheus
 * exporter mounted on the daemon's HTTP endpoint. Names follow the messaging
 * conventions where one exists; Tally's own figures live under `tally.*`.
 * Prometheus turns dots into underscores and adds `_total` to counters
 * (`tally.duplicates` -> `tally_duplicates_total`); instruments in seconds get
 * a `_seconds` suffix through a view (`prometheusViews`), as the OpenTelemetry
 * to Prometheus mapping asks and as `promtool check metrics` expects. Operators
 * alert on those names (deploy/prometheus), so they are part of the contract
 * (docs/observability.md, "Metrics").
 */
import type { Attributes, Meter } from '@opentelemetry/api';
import type { ViewOptions } from '@opentelemetry/sdk-metrics';
import { COUNTER_NAMES, COUNTERS, type BatchResult, type CounterName, type CounterValues, type TallyMode } from '@tally/shared';
import type { LocalHistogram, LocalHistogramProducer } from './local-histograms.js';
import { processAttributes, queueAttributes } from './queue-attributes.js';
import { ATTR_MESSAGING_OPERATION_NAME, METRIC_MESSAGING_CLIENT_CONSUMED_MESSAGES, METRIC_MESSAGING_PROCESS_DURATION } from './semconv.js';

export interface MetricSources {
  /** Counters since this process started. */
  readonly counters: () => CounterValues;
  readonly inFlight: () => number;
  readonly shardDepths: () => number[];
  readonly connections: () => { amqp: boolean; redis: boolean };
  /** Seconds since the oldest delivery still unacked arrived; 0 when none is (or the daemon cannot tell). */
  readonly oldestUnackedAgeSeconds?: () => number;
  /**
   * TALLY_PARTITIONS > 1: the partitions held and each one's figures. The
   * in-flight and oldest-unacked gauges are then one series per partition
   * held, labelled `partition`; `tally.partitions.held` and
   * `tally.partitions.configured` let the alert rules find a partition no
   * daemon holds and an imbalance. Absent with one queue (the series stay
   * as they were).
   */
  readonly partitions?: {
    readonly configured: number;
    held(): readonly number[];
    channels(): ReadonlyArray<{ readonly partition: number | null; readonly unacked: number; readonly oldestUnackedAgeMs: number | null }>;
  };
  /** Redis refusals as RedisHealth tracks them (redis-health.ts). */
  readonly redisRefusals?: {
    /** Error types refused right now (`OOM`, `READONLY`, `unavailable`, …). */
    refusingTypes(): ReadonlySet<string>;
    /** Refused attempts since start, by error type. */
    readonly attemptsByType: ReadonlyMap<string, number>;
  };
}

const SIZE_BUCKETS = [1, 10, 50, 100, 200, 500, 1000, 2000, 5000, 10000];
const SECONDS_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** Instruments recorded in seconds: their Prometheus names end in `_seconds`. */
export const SECONDS_INSTRUMENTS = Object.freeze([
  'tally.flush.duration',
  'tally.crash_window.duration',
  METRIC_MESSAGING_PROCESS_DURATION,
  'tally.message.age',
  'tally.oldest_unacked_age',
]);

/** The exported name of a seconds instrument: its Prometheus name ends in `_seconds`. */
export function secondsName(name: string): string {
  return `${name}_seconds`;
}

/** Views that give each seconds instrument its unit suffix on the Prometheus side. */
export function prometheusViews(): ViewOptions[] {
  return SECONDS_INSTRUMENTS.map((name) => ({ instrumentName: name, name: secondsName(name) }));
}

/** The per-delivery histograms (recorded in recordAck): kept local and exported by a producer, not through SDK instruments. */
export const PROCESS_DURATION = Object.freeze({ name: METRIC_MESSAGING_PROCESS_DURATION, description: 'From delivery to ack', boundaries: SECONDS_BUCKETS });
export const MESSAGE_AGE = Object.freeze({
  name: 'tally.message.age',
  description: 'End-to-end age at ack: ack time minus the message timestamp property, when present',
  boundaries: Object.freeze([...SECONDS_BUCKETS, 30, 60, 300]),
});

/**
 * The exposure counters are kept in Redis as integer milliseconds, which add
 * exactly across daemons and restarts; the metrics carry them in seconds,
 * Prometheus' base unit (`tally_loaded_seconds_total`, not `_ms_total`).
 */
const MILLISECOND_COUNTERS: Readonly<Partial<Record<CounterName, { name: string; description: string }>>> = Object.freeze({
  loaded_ms: { name: 'loaded_seconds', description: 'seconds during which at least half of the prefetch window was unacked (the daemon under load)' },
  window_message_ms: {
    name: 'window_message_seconds',
    description: 'message-seconds spent inside the crash window (counts written, markers not yet); / loaded_seconds = messages a crash re-counts',
  },
  occupied_unacked_message_ms: {
    name: 'occupied_unacked_message_seconds',
    description: 'message-seconds marked but not yet acked; / loaded_seconds = messages a crash re-counts when its recovery outlasts the marker TTL',
  },
});

/** The instrument name (before Prometheus' `_total`), description and scale of one counter of the stats hash. */
export function counterInstrument(name: CounterName): { name: string; description: string; scale: number } {
  const inSeconds = MILLISECOND_COUNTERS[name];
  if (inSeconds !== undefined) return { name: `tally.${inSeconds.name}`, description: inSeconds.description, scale: 1 / 1000 };
  return { name: `tally.${name}`, description: COUNTERS[name], scale: 1 };
}

/** Counters that cannot happen in a mode are not exported at all, rather than as a misleading 0. */
export function counterApplies(name: string, mode: TallyMode): boolean {
  return !(mode === 'atomic' && name === 'occupation_failures');
}

export class DaemonMetrics {
  private readonly base: Attributes;
  private readonly processBase: Attributes;
  private readonly batchSize;
  private readonly flushDuration;
  private readonly crashWindow;
  private readonly processDuration: LocalHistogram;
  private readonly messageAge: LocalHistogram;

  /**
   * @param histograms where the per-delivery histograms live: the producer the
   *   Prometheus exporter reads (metrics-export.ts), scoped like `meter`.
   */
  constructor(meter: Meter, options: { queue: string; mode: TallyMode; virtualShards: number }, sources: MetricSources, histograms: LocalHistogramProducer) {
    this.base = queueAttributes(options.queue);
    this.processBase = processAttributes(options.queue);
    const base = this.base;

    meter
      .createObservableCounter(METRIC_MESSAGING_CLIENT_CONSUMED_MESSAGES, { description: 'Deliveries consumed, redeliveries included', unit: '{message}' })
      .addCallback((result) => result.observe(sources.counters().received, { ...base, [ATTR_MESSAGING_OPERATION_NAME]: 'consume' }));
    for (const name of COUNTER_NAMES) {
      if (!counterApplies(name, options.mode)) continue;
      const instrument = counterInstrument(name);
      meter
        .createObservableCounter(instrument.name, { description: instrument.description, ...(instrument.scale === 1 ? {} : { unit: 's' }) })
        .addCallback((result) => result.observe(sources.counters()[name] * instrument.scale, base));
    }
    meter
      .createObservableGauge('tally.info', {
        description: 'Constant 1, labelled with the mode and the layout; in atomic mode occupation failures cannot happen and are not exported',
      })
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
      .addCallback((result) => {
        const partitions = sources.partitions;
        if (partitions === undefined) return result.observe(sources.inFlight(), base);
        for (const c of partitions.channels()) if (c.partition !== null) result.observe(c.unacked, { ...base, partition: String(c.partition) });
      });
    meter
      .createObservableGauge('tally.shard.queue_depth', { description: 'Parts waiting in each virtual shard lane', unit: '{part}' })
      .addCallback((result) => sources.shardDepths().forEach((depth, shard) => result.observe(depth, { ...base, 'tally.shard': shard })));
    meter.createObservableGauge('tally.connection.up', { description: '1 while the connection to the server is usable, else 0' }).addCallback((result) => {
      const { amqp, redis } = sources.connections();
      result.observe(amqp ? 1 : 0, { ...base, 'server.type': 'rabbitmq' });
      result.observe(redis ? 1 : 0, { ...base, 'server.type': 'redis' });
    });
    // Invariant 10: a delivery that cannot finish shows here long before anyone reads a log.
    meter
      .createObservableGauge('tally.oldest_unacked_age', { description: 'Seconds since the oldest delivery still unacked arrived; 0 when none is', unit: 's' })
      .addCallback((result) => {
        const partitions = sources.partitions;
        if (partitions === undefined) return result.observe(Math.max(0, sources.oldestUnackedAgeSeconds?.() ?? 0), base);
        for (const c of partitions.channels()) {
          if (c.partition !== null) result.observe(Math.max(0, (c.oldestUnackedAgeMs ?? 0) / 1000), { ...base, partition: String(c.partition) });
        }
      });
    const partitions = sources.partitions;
    if (partitions !== undefined) {
      meter
        .createObservableGauge('tally.partitions.held', { description: 'Partitions this daemon is subscribed to (TALLY_PARTITIONS > 1)', unit: '{partition}' })
        .addCallback((result) => result.observe(partitions.held().length, base));
      meter
        .createObservableGauge('tally.partitions.configured', {
          description: 'TALLY_PARTITIONS: the partition queues behind the exchange',
          unit: '{partition}',
        })
        .addCallback((result) => result.observe(partitions.configured, base));
      meter.createObservableGauge('tally.partition.held', { description: '1 for each partition this daemon is subscribed to' }).addCallback((result) => {
        for (const p of partitions.held()) result.observe(1, { ...base, partition: String(p) });
      });
    }

    // Invariant 11: a Redis that refuses writes (OOM, READONLY, MASTERDOWN,
    // LOADING) or does not answer is waited out; these make the wait visible.
    const refusals = sources.redisRefusals;
    if (refusals !== undefined) {
      const seen = new Set<string>();
      meter
        .createObservableGauge('tally.redis.refusing', {
          description:
            '1 while Redis refuses (or does not answer) the writes of a batch step, by error.type (OOM, READONLY, MASTERDOWN, LOADING, unavailable, …); 0 otherwise',
        })
        .addCallback((result) => {
          const now = refusals.refusingTypes();
          for (const type of now) seen.add(type);
          // One series per type ever seen, so a cleared refusal reads 0 rather than vanishing; a bare 0 until then.
          if (seen.size === 0) result.observe(0, base);
          for (const type of seen) result.observe(now.has(type) ? 1 : 0, { ...base, 'error.type': type });
        });
      meter
        .createObservableCounter('tally.redis.refused_attempts', {
          description: 'Redis calls refused or unanswered and retried, by error.type',
          unit: '{attempt}',
        })
        .addCallback((result) => {
          for (const [type, count] of refusals.attemptsByType) result.observe(count, { ...base, 'error.type': type });
        });
    }

    this.batchSize = meter.createHistogram('tally.batch.size', {
      description: 'Parts per shard batch',
      unit: '{part}',
      advice: { explicitBucketBoundaries: SIZE_BUCKETS },
    });
    const secondsHistogram = (name: string, description: string, buckets = SECONDS_BUCKETS) =>
      meter.createHistogram(name, { description, unit: 's', advice: { explicitBucketBoundaries: buckets } });
    this.flushDuration = secondsHistogram('tally.flush.duration', 'From a shard batch leaving its lane to its result: pre-check, write, occupy');
    this.crashWindow = secondsHistogram('tally.crash_window.duration', 'From the start of the count write to the end of marker occupation');
    // Recorded once or twice per delivery: an SDK record() hashes its attributes every time (local-histograms.ts says why not).
    const local = (spec: { name: string; description: string; boundaries: readonly number[] }, attributes: Attributes) =>
      histograms.create({ name: secondsName(spec.name), description: spec.description, unit: 's', boundaries: spec.boundaries, attributes });
    this.processDuration = local(PROCESS_DURATION, this.processBase);
    this.messageAge = local(MESSAGE_AGE, this.base);
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
    this.processDuration.record((monotonicNow - receivedAt) / 1000);
    if (publishedAt !== undefined) this.messageAge.record(Math.max(0, wallNow - publishedAt) / 1000);
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
