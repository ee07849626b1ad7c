/**
 * The `tally.batch` span of one shard batch, made in the coordinator. It
 * links to the producer context of each message it holds (W3C traceparent
 * header), and its context travels to the worker thread in the task, where
 * the step spans (pre-check, write, crash window, occupy) become its children.
 *
 * Links: every distinct producer context that was sampled (an unsampled one
 * leads to no trace), up to the SDK's span limit OTEL_SPAN_LINK_COUNT_LIMIT
 * (128 by default). The SDK enforces that limit and exports what it dropped
 * in the span's standard `droppedLinksCount`; `tally.producers.sampled` says
 * how many there were. Links are added only to a recording span: an
 * unsampled batch does not even parse the headers.
 */
import { context, propagation, SpanKind, SpanStatusCode, trace, TraceFlags, type Link, type Span, type Tracer } from '@opentelemetry/api';
import type { BatchResult, TallyMode } from '@tally/shared';
import { processAttributes } from './queue-attributes.js';
import { ATTR_ERROR_TYPE, ATTR_MESSAGING_BATCH_MESSAGE_COUNT, ATTR_MESSAGING_OPERATION_NAME } from './semconv.js';

const TRACEPARENT = /^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** A producer's span context from a traceparent header; hostile input yields undefined. */
export function producerLink(traceparent: unknown): Link | undefined {
  if (typeof traceparent !== 'string' || traceparent.length !== 55) return undefined;
  const match = TRACEPARENT.exec(traceparent);
  if (!match || /^0+$/.test(match[1]!) || /^0+$/.test(match[2]!)) return undefined;
  return { context: { traceId: match[1]!, spanId: match[2]!, traceFlags: Number.parseInt(match[3]!, 16) & 1, isRemote: true } };
}

export interface BatchSpanInput {
  readonly vshard: number;
  readonly queue: string;
  readonly mode: TallyMode;
  readonly parts: number;
  /** Asked only when the span records: an untraced batch does not even collect its producers' headers. */
  readonly traceparents: () => readonly (string | undefined)[];
  readonly distinctSkus: () => number;
}

export interface StartedBatchSpan {
  readonly span: Span;
  /** The span's context as a traceparent, for the worker thread; undefined when not recording. */
  readonly traceparent: string | undefined;
}

/** The distinct, sampled producer contexts among a batch's traceparent headers, in arrival order. */
export function sampledProducerLinks(traceparents: readonly (string | undefined)[]): Link[] {
  const links: Link[] = [];
  const seen = new Set<string>();
  for (const header of traceparents) {
    if (header === undefined || seen.has(header)) continue;
    seen.add(header);
    const link = producerLink(header);
    if (link !== undefined && (link.context.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED) links.push(link);
  }
  return links;
}

export function startBatchSpan(tracer: Tracer, input: BatchSpanInput): StartedBatchSpan {
  // A new root per batch: a batch serves many producers, so it links to them
  // rather than pretending to be the child of one.
  const span = tracer.startSpan(
    'tally.batch',
    {
      kind: SpanKind.CONSUMER,
      root: true,
      attributes: {
        ...processAttributes(input.queue),
        [ATTR_MESSAGING_OPERATION_NAME]: 'process',
        [ATTR_MESSAGING_BATCH_MESSAGE_COUNT]: input.parts,
        'tally.shard': input.vshard,
        'tally.mode': input.mode,
      },
    },
    context.active(),
  );
  if (!span.isRecording()) return { span, traceparent: undefined };
  const links = sampledProducerLinks(input.traceparents());
  span.addLinks(links);
  span.setAttributes({ 'tally.producers.sampled': links.length, 'tally.skus.distinct': input.distinctSkus() });
  const carrier: Record<string, string> = {};
  propagation.inject(trace.setSpan(context.active(), span), carrier);
  return { span, traceparent: carrier.traceparent };
}

export function endBatchSpan(span: Span, result: BatchResult): void {
  if (span.isRecording()) {
    let duplicates = 0;
    for (const flag of result.marked) duplicates += flag;
    span.setAttributes({
      'tally.messages.new': result.marked.length - duplicates,
      'tally.messages.duplicate': duplicates,
      'tally.messages.dead_lettered': result.refusals.length,
      'tally.occupation_failures': result.occupationFailures,
      'tally.write_retries': result.writeRetries,
    });
    if (result.occupationFailures > 0) {
      span.addEvent('tally.occupation_failure', { 'tally.shard': result.vshard });
      span.setStatus({ code: SpanStatusCode.ERROR, message: 'marker occupation failed after the counts were written (crash window open)' });
    } else if (result.refusals.length > 0) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: `${result.refusals.length} parts refused by Redis (dead-lettered count-refused)` });
    }
  }
  span.end();
}

export function failBatchSpan(span: Span, error: unknown): void {
  if (span.isRecording()) {
    span.recordException(error instanceof Error ? error : new Error(String(error)));
    span.addEvent('tally.batch_retry');
  }
}

/** A short span for one dead-lettered message, linked to its producer. */
export function recordDeadLetter(tracer: Tracer, queue: string, reasonCode: string, traceparent: unknown): void {
  const link = producerLink(traceparent);
  const span = tracer.startSpan('tally.dead_letter', {
    kind: SpanKind.CONSUMER,
    root: true,
    links: link ? [link] : [],
    attributes: {
      ...processAttributes(queue),
      'tally.messages.dead_lettered': 1,
      [ATTR_ERROR_TYPE]: reasonCode,
    },
  });
  if (span.isRecording()) {
    span.addEvent('tally.dead_letter', { 'tally.reason': reasonCode });
    span.setStatus({ code: SpanStatusCode.ERROR, message: `dead-lettered: ${reasonCode}` });
  }
  span.end();
}
