/**
 * Tracing bootstrap, shared by the coordinator and every worker thread (each
 * thread is its own isolate, so each registers its own tracer provider and
 * exporter; spans still join one trace through the context passed in tasks).
 *
 * Configured only by the standard OTEL_* variables, and off unless one of
 * them asks for traces: with tracing off the OpenTelemetry API stays a no-op
 * and costs nothing measurable.
 */
import { NodeSDK } from '@opentelemetry/sdk-node';

export type Env = Readonly<Record<string, string | undefined>>;

/** Traces are on when an exporter or an endpoint is named, and the SDK is not disabled. */
export function tracingRequested(env: Env): boolean {
  if (/^true$/i.test(env.OTEL_SDK_DISABLED ?? '')) return false;
  const exporters = (env.OTEL_TRACES_EXPORTER ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  if (exporters.length > 0) return !exporters.every((e) => e === 'none');
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}

export interface TracingHandle {
  /** Exports what is buffered; call before a thread or the process goes away. */
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

export function startTracing(env: Env = process.env, serviceName = 'tally'): TracingHandle | null {
  if (!tracingRequested(env)) return null;
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
      const { trace } = await import('@opentelemetry/api');
      const provider = trace.getTracerProvider() as unknown as { getDelegate?: () => { forceFlush?: () => Promise<void> } };
      await provider.getDelegate?.().forceFlush?.();
    },
    shutdown: () => sdk.shutdown(),
  };
}
