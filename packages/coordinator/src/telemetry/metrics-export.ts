/**
 * The metrics pipeline behind /metrics: a MeterProvider read by a Prometheus
 * exporter (no server of its own: HttpEndpoints mounts its handler).
 *
 * `target_info` carries the resource. Without a service name the SDK says
 * `unknown_service:node`; Tally names itself `tally`, and the standard
 * OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES still override it (the SDK's
 * environment detector reads them, as it does for traces).
 */
import type { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import type { MeterProvider } from '@opentelemetry/sdk-metrics';
import type { LocalHistogramProducer } from './local-histograms.js';
import { prometheusViews } from './metrics.js';
import { ATTR_SERVICE_NAME } from './semconv.js';

export const DEFAULT_SERVICE_NAME = 'tally';
/** The meter every daemon metric comes from; the local histograms carry the same scope. */
export const METER_NAME = 'tally';

export interface MetricsExport {
  readonly exporter: PrometheusExporter;
  readonly provider: MeterProvider;
  /** Per-delivery histograms outside the SDK, merged into every scrape (local-histograms.ts). */
  readonly histograms: LocalHistogramProducer;
}

/** Loaded only when asked for: a daemon without metrics does not pay their start-up. */
export async function createMetricsExport(): Promise<MetricsExport> {
  const [{ PrometheusExporter }, { MeterProvider }, { defaultResource, detectResources, envDetector, resourceFromAttributes }, { LocalHistogramProducer }] =
    await Promise.all([
      import('@opentelemetry/exporter-prometheus'),
      import('@opentelemetry/sdk-metrics'),
      import('@opentelemetry/resources'),
      // It imports sdk-metrics too: loaded here, not by runtime.ts's static import of this file.
      import('./local-histograms.js'),
    ]);
  const resource = defaultResource()
    .merge(resourceFromAttributes({ [ATTR_SERVICE_NAME]: DEFAULT_SERVICE_NAME }))
    .merge(detectResources({ detectors: [envDetector] }));
  // getMeter(name) has scope { name, version: '' }: an empty version prints no otel_scope_version label, as here.
  const histograms = new LocalHistogramProducer({ name: METER_NAME }, resource);
  // sdk-metrics 2.x MetricReader.collect merges each producer's scopeMetrics after the SDK's own.
  const exporter = new PrometheusExporter({ preventServerStart: true, metricProducers: [histograms] });
  const provider = new MeterProvider({ resource, readers: [exporter], views: prometheusViews() });
  return { exporter, provider, histograms };
}
