/**
 * Producer trace links against the SDK's link limit. A `tally.batch` span
 * links to the sampled producer context of each message it holds
 * (batch-span.ts), but the SDK keeps at most OTEL_SPAN_LINK_COUNT_LIMIT
 * links per span (128 by default) and drops the rest: with a batch of 500
 * messages a trace of every producer then reaches its batch for about a
 * quarter of them (issue 26: a drain of 2,049 traced messages linked 1,001 to
 * 1,369). Tally does not raise the limit itself: every link is serialised
 * with the span and exported, which costs throughput at high sampling
 * (docs/benchmark.md, "Tracing"). It says so once, at start, instead. Pure:
 * the entry point passes the environment.
 */
export type Env = Readonly<Record<string, string | undefined>>;

/** The SDK's default OTEL_SPAN_LINK_COUNT_LIMIT. */
export const DEFAULT_SPAN_LINK_LIMIT = 128;

/** The link limit the SDK applies: OTEL_SPAN_LINK_COUNT_LIMIT when it is a non-negative integer, else its default. */
export function spanLinkLimit(env: Env): number {
  const raw = env.OTEL_SPAN_LINK_COUNT_LIMIT?.trim() ?? '';
  return /^\d+$/.test(raw) ? Number(raw) : DEFAULT_SPAN_LINK_LIMIT;
}

/**
 * False when the configured sampler never records a batch span: a batch span
 * is a root, so `always_off`, `parentbased_always_off` and a ratio of 0 record
 * none. Any other sampler (the default `parentbased_always_on` included) may.
 */
export function batchSpansSampled(env: Env): boolean {
  const sampler = (env.OTEL_TRACES_SAMPLER ?? '').trim().toLowerCase();
  if (sampler === 'always_off' || sampler === 'parentbased_always_off') return false;
  if (sampler === 'traceidratio' || sampler === 'parentbased_traceidratio') {
    const ratio = Number((env.OTEL_TRACES_SAMPLER_ARG ?? '').trim());
    if ((env.OTEL_TRACES_SAMPLER_ARG ?? '').trim() !== '' && Number.isFinite(ratio) && ratio <= 0) return false;
  }
  return true;
}

export interface LinkShortfall {
  /** The links a batch span keeps. */
  readonly limit: number;
  /** The messages a batch may hold (TALLY_BATCH_SIZE), each a producer context to link. */
  readonly batchSize: number;
}

/**
 * With tracing on: the shortfall when a batch may hold more messages than its
 * span keeps links (then the one start warning names
 * OTEL_SPAN_LINK_COUNT_LIMIT); null when every producer can be linked or no
 * batch span is sampled.
 */
export function producerLinkShortfall(env: Env, batchSize: number): LinkShortfall | null {
  if (!batchSpansSampled(env)) return null;
  const limit = spanLinkLimit(env);
  return batchSize > limit ? { limit, batchSize } : null;
}

/** The start warning's line. */
export function linkShortfallLine({ limit, batchSize }: LinkShortfall): string {
  return (
    `a batch may hold ${batchSize} messages (TALLY_BATCH_SIZE) but its span keeps ${limit} producer links (OTEL_SPAN_LINK_COUNT_LIMIT): ` +
    `the rest are dropped (droppedLinksCount), so those producers' traces do not lead to their batch; ` +
    `set OTEL_SPAN_LINK_COUNT_LIMIT=${batchSize} to link them all (each link is exported with its span: sample to keep the cost down)`
  );
}
