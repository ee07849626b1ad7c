/**
 * Spans of a batch inside its worker thread, for both modes: each step runs
 * in its own span, a child of the coordinator's `tally.batch` span carried
 * in the task's traceparent.
 */
import { SpanStatusCode, trace, type Span, type Tracer } from '@opentelemetry/api';
import { describeError } from '@tally/shared';

/**
 * The tracer is looked up per batch, not at import: this ESM module and the
 * CommonJS SDK hold separate copies of the API's proxy provider, so a tracer
 * taken before the thread registered its provider would stay a no-op.
 */
export function batchTracer(): Tracer {
  return trace.getTracer('tally.worker');
}

/**
 * Runs a step inside its own span, a child of the batch span in the active
 * context. A step that throws leaves its exception and an error status on
 * the span, then the error goes on to the caller.
 */
export function inSpan<T>(tracer: Tracer, name: string, attributes: Record<string, number>, run: (span: Span) => Promise<T>): Promise<T> {
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await run(span);
    } catch (error) {
      span.recordException(error instanceof Error ? error : new Error(describeError(error)));
      span.setStatus({ code: SpanStatusCode.ERROR, message: `${name} failed: ${describeError(error)}` });
      throw error;
    } finally {
      span.end();
    }
  });
}
