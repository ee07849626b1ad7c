/**
 * Histograms recorded once per delivery, kept as plain bucket counts and
 * exported through a MetricProducer handed to the Prometheus exporter.
 *
 * Why not the SDK instrument: every `Histogram.record()` of sdk-metrics hashes
 * its attribute set (Object.keys, sort, map, JSON.stringify) and calls
 * Date.now() before it reaches the bucket search. Per delivery that cost the
 * daemon ≈ 4.8 µs/msg with metrics on (notes/profile.md). Here the attribute
 * set is fixed per histogram, so a record is a bucket search and four adds.
 *
 * What a scrape sees is what the SDK instrument gave: the same descriptor name
 * (the `_seconds` suffix the view gave), description, unit, explicit bucket
 * boundaries, attributes (the same object, so the same label order), scope
 * (`tally`, so the same `otel_scope_name` label), cumulative points, and no
 * family at all before the first record. Bucket placement follows the SDK:
 * a value lands in the first bucket whose upper bound is >= it; NaN and
 * negative values are dropped, as the SDK's histogram drops them.
 */
import { ValueType, type Attributes, type HrTime } from '@opentelemetry/api';
import {
  AggregationTemporality,
  DataPointType,
  type CollectionResult,
  type HistogramMetricData,
  type MetricProducer,
  type ResourceMetrics,
  type ScopeMetrics,
} from '@opentelemetry/sdk-metrics';

export interface LocalHistogramOptions {
  /** The exported name, as the SDK view would have named it (`tally.message.age_seconds`). */
  readonly name: string;
  readonly description: string;
  readonly unit: string;
  /** Sorted upper bounds; one more bucket (+Inf) follows the last. */
  readonly boundaries: readonly number[];
  /** The one attribute set every record carries. */
  readonly attributes: Attributes;
}

/** One histogram with one fixed attribute set: counts per bucket, sum, count, min and max. */
export class LocalHistogram {
  readonly options: LocalHistogramOptions;
  private readonly boundaries: Float64Array;
  private readonly counts: Float64Array;
  private count = 0;
  private sum = 0;
  private min = Infinity;
  private max = -Infinity;
  /** Epoch time of the first record: the start of the cumulative point. */
  private startTime: HrTime | null = null;

  constructor(options: LocalHistogramOptions) {
    for (let i = 1; i < options.boundaries.length; i++) {
      if (!(options.boundaries[i - 1]! < options.boundaries[i]!)) throw new RangeError(`${options.name}: bucket boundaries must be strictly increasing`);
    }
    this.options = Object.freeze({ ...options, boundaries: Object.freeze([...options.boundaries]) });
    this.boundaries = Float64Array.from(options.boundaries);
    this.counts = new Float64Array(options.boundaries.length + 1);
  }

  record(value: number): void {
    // `!(value >= 0)` drops NaN and negatives in one test, as the SDK does (it warns; a per-delivery warning would flood).
    if (!(value >= 0)) return;
    if (this.startTime === null) this.startTime = hrTimeNow();
    const bounds = this.boundaries;
    // Binary search for the first bound >= value (the SDK's binarySearchUB); values above every bound go to +Inf.
    let lo = 0;
    let hi = bounds.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (bounds[mid]! < value) lo = mid + 1;
      else hi = mid;
    }
    this.counts[lo]!++;
    this.count++;
    this.sum += value;
    if (value < this.min) this.min = value;
    if (value > this.max) this.max = value;
  }

  /** The cumulative metric, or null before the first record (the SDK exports no family then either). */
  collect(endTime: HrTime): HistogramMetricData | null {
    if (this.count === 0 || this.startTime === null) return null;
    const { name, description, unit, boundaries, attributes } = this.options;
    return {
      descriptor: { name, description, unit, valueType: ValueType.DOUBLE },
      aggregationTemporality: AggregationTemporality.CUMULATIVE,
      dataPointType: DataPointType.HISTOGRAM,
      dataPoints: [
        {
          attributes,
          startTime: this.startTime,
          endTime,
          // A copy: the exporter serializes after an await, while records go on.
          value: {
            buckets: { boundaries: [...boundaries], counts: Array.from(this.counts) },
            count: this.count,
            sum: this.sum,
            min: this.min,
            max: this.max,
          },
        },
      ],
    };
  }
}

/** The MetricProducer the Prometheus exporter merges into every collect: one scope, the histograms recorded so far. */
export class LocalHistogramProducer implements MetricProducer {
  private readonly histograms: LocalHistogram[] = [];

  /**
   * @param scope the meter's scope: the exporter labels every series with `otel_scope_name` from it.
   * @param resource the MeterProvider's (the reader keeps the SDK's resource anyway; this keeps the result whole).
   */
  constructor(
    private readonly scope: ScopeMetrics['scope'],
    private readonly resource: ResourceMetrics['resource'],
  ) {}

  create(options: LocalHistogramOptions): LocalHistogram {
    if (this.histograms.some((h) => h.options.name === options.name)) throw new RangeError(`histogram ${options.name} exists already`);
    const histogram = new LocalHistogram(options);
    this.histograms.push(histogram);
    return histogram;
  }

  collect(): Promise<CollectionResult> {
    const endTime = hrTimeNow();
    const metrics: HistogramMetricData[] = [];
    for (const histogram of this.histograms) {
      const data = histogram.collect(endTime);
      if (data !== null) metrics.push(data);
    }
    const scopeMetrics = metrics.length === 0 ? [] : [{ scope: this.scope, metrics }];
    return Promise.resolve({ resourceMetrics: { resource: this.resource, scopeMetrics }, errors: [] });
  }
}

function hrTimeNow(): HrTime {
  const ms = Date.now();
  return [Math.floor(ms / 1000), (ms % 1000) * 1e6];
}
