/**
 * Tracing bootstrap, shared by the coordinator and every worker thread (each
 * thread is its own isolate, so each registers its own tracer provider and
 * exporter; spans still join one trace through the context passed in tasks).
 *
 * Configured only by the standard OTEL_* variables, and off unless one of
 * them asks for traces: with tracing off the OpenTelemetry API stays a no-op
 * and costs nothing measurable.
 */
import { trace } from '@opentelemetry/api';

export type Env = Readonly<Record<string, string | undefined>>;

/** Traces are on when an exporter or an endpoint is named, and the SDK is not disabled. */
export function tracingRequested(env: Env): boolean {
  if (/^true$/i.test(env.OTEL_SDK_DISABLED ?? '')) return false;
  const exporters = (env.OTEL_TRACES_EXPORTER ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (exporters.length > 0) return !exporters.every((e) => e === 'none');
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}

export interface TracingHandle {
  /** Exports what is buffered; call before a thread or the process goes away. */
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

/**
 * The SDK is imported only when tracing is on: it pulls in every exporter
 * and costs each thread a noticeable share of its start-up otherwise.
 */
export async function startTracing(env: Env = process.env, serviceName = 'tally'): Promise<TracingHandle | null> {
  if (!tracingRequested(env)) return null;
  const { NodeSDK } = await import('@opentelemetry/sdk-node');
  const sdk = new NodeSDK({
    ...(env.OTEL_SERVICE_NAME ? {} : { serviceName }),
    // Traces only: metrics are served on TALLY_METRICS_PORT by the
    // coordinator, logs are JSON lines on stdout.
    metricReaders: [],
    logRecordProcessors: [],
    instrumentations: [],
  });
  sdk.start();
  return {
    flush: async () => {
      const provider = trace.getTracerProvider() as unknown as { getDelegate?: () => { forceFlush?: () => Promise<void> } };
      await provider.getDelegate?.().forceFlush?.();
    },
    shutdown: () => sdk.shutdown(),
  };
}

/**
 * pino mixin: every record made inside a span carries its trace and span ids,
 * so a log line leads to its trace in Jaeger and back.
 */
export function traceIdsOfActiveSpan(): { trace_id?: string; span_id?: string } {
  const span = trace.getActiveSpan();
  if (span === undefined) return {};
  const { traceId, spanId } = span.spanContext();
  return { trace_id: traceId, span_id: spanId };
}
