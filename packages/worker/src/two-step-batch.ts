/**
 * The two-step batch: pre-check markers, write counts, occupy markers.
 *
 *   MGET markers          -> which parts are new
 *   MULTI INCRBY/EXPIRE … SET receipt EXEC   -> counts written (all or none)
 *   pipeline SET marker EX …                 -> markers occupied
 *
 * The order is the point (invariant 2): a marker is occupied only after its
 * counts are written. A crash between the two double-counts on redelivery,
 * which the counters make visible; the reverse order would lose the counts
 * invisibly. The window between them is one per shard batch, not one per
 * message.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { SpanStatusCode, trace, type Span, type Tracer } from '@opentelemetry/api';
import type { Redis } from 'ioredis';
import { ReplyError } from 'ioredis';
import {
  backoffDelay,
  countKey,
  markerKey,
  receiptKey,
  type BatchResult,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { aggregateNewParts, selectNewParts } from './aggregate.js';
import { isTransientReply } from './redis-connection.js';

export interface BatchLog {
  warn(fields: Record<string, unknown>, message: string): void;
  error(fields: Record<string, unknown>, message: string): void;
}

/** Test hook: called between the count write and the marker occupation. */
export interface BatchHooks {
  afterCountWrite?: (task: BatchTask) => void | Promise<void>;
}

/**
 * The tracer is looked up per batch, not at import: this ESM module and the
 * CommonJS SDK hold separate copies of the API's proxy provider, so a tracer
 * taken before the thread registered its provider would stay a no-op.
 */
function batchTracer(): Tracer {
  return trace.getTracer('tally.worker');
}

/** Runs a step inside its own span, a child of the batch span in the active context. */
function inSpan<T>(tracer: Tracer, name: string, attributes: Record<string, number>, run: (span: Span) => Promise<T>): Promise<T> {
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await run(span);
    } finally {
      span.end();
    }
  });
}

type ExecResults = Array<[Error | null, unknown]> | null;

/** Throws on a transport failure or a transient reply; returns how many commands Redis refused for good. */
function refusals(results: ExecResults, what: string): number {
  if (results === null) throw new Error(`${what}: transaction aborted`);
  let refused = 0;
  for (const [error] of results) {
    if (error === null) continue;
    if (error instanceof ReplyError && !isTransientReply(error.message)) refused++;
    else throw error;
  }
  return refused;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Retries an idempotent step until it succeeds: outages wait, they do not drop (invariant 8). */
async function untilDone<T>(step: string, task: BatchTask, log: BatchLog, run: () => Promise<T>, onFailure?: () => void): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await run();
    } catch (error) {
      onFailure?.();
      const span = trace.getActiveSpan();
      span?.addEvent('tally.redis_error', { 'tally.step': step, 'tally.attempt': attempt, 'exception.message': describe(error) });
      span?.setStatus({ code: SpanStatusCode.ERROR, message: `redis error in ${step}: ${describe(error)}` });
      const delayMs = backoffDelay(attempt);
      log.warn({ step, vshard: task.vshard, attempt, delayMs, err: describe(error) }, 'redis step failed; retrying');
      await sleep(delayMs);
    }
  }
}

export async function runTwoStepBatch(
  redis: Redis,
  settings: WorkerSettings,
  task: BatchTask,
  log: BatchLog,
  hooks: BatchHooks = {},
): Promise<BatchResult> {
  const { prefix, markerTtlS, countTtlS } = settings;
  const { vshard, ids, changes } = task;
  const markerKeys = ids.map((id) => markerKey(prefix, vshard, id));

  const tracer = batchTracer();
  const t0 = performance.now();
  const values = await inSpan(tracer, 'tally.precheck', { 'tally.shard': vshard, 'tally.markers': markerKeys.length }, () =>
    untilDone('precheck', task, log, () => redis.mget(markerKeys)),
  );
  const marked = selectNewParts(ids, values);
  const t1 = performance.now();

  const sums = aggregateNewParts(changes, (i) => marked[i] === 0);
  // The window opens with the count write and closes when the markers are
  // occupied; its span is a sibling of the two step spans it spans.
  const crashWindow = tracer.startSpan('tally.crash_window', { attributes: { 'tally.shard': vshard } });
  let writeRetries = 0;
  let countErrors = 0;
  if (sums.size > 0) {
    const receipt = receiptKey(prefix, vshard, randomUUID());
    let outcomeUnknown = false;
    countErrors = await inSpan(tracer, 'tally.write_counts', { 'tally.shard': vshard, 'tally.skus.distinct': sums.size }, () => untilDone(
      'write_counts',
      task,
      log,
      async () => {
        // After a failed attempt the write may or may not have landed. The
        // receipt is set in the same transaction as the counts, so its
        // presence says which: no blind retry, no silent double count.
        if (outcomeUnknown && (await redis.exists(receipt)) === 1) return 0;
        const tx = redis.multi();
        for (const [sku, sum] of sums) {
          const key = countKey(prefix, vshard, sku);
          tx.incrby(key, sum.toString());
          tx.expire(key, countTtlS);
        }
        tx.set(receipt, '1', 'EX', markerTtlS);
        outcomeUnknown = true;
        return refusals(await tx.exec(), 'write_counts');
      },
      () => {
        writeRetries++;
      },
    ));
    if (countErrors > 0) {
      log.error({ vshard, countErrors }, 'redis refused count increments (overflow or a non-integer value in a count key)');
    }
  }
  const t2 = performance.now();

  await hooks.afterCountWrite?.(task);

  let occupationFailures = 0;
  if (marked.includes(0)) {
    await inSpan(tracer, 'tally.occupy_markers', { 'tally.shard': vshard }, () => untilDone(
      'occupy_markers',
      task,
      log,
      async () => {
        // SET is idempotent, so a failed pipeline is simply sent again whole.
        const pipeline = redis.pipeline();
        for (let i = 0; i < ids.length; i++) if (marked[i] === 0) pipeline.set(markerKeys[i]!, '1', 'EX', markerTtlS);
        if (refusals(await pipeline.exec(), 'occupy_markers') > 0) throw new Error('occupy_markers: redis refused a marker');
      },
      () => {
        // The counts are written and the markers are not: the crash window
        // is open for this batch until a retry succeeds. Counted once per batch.
        if (occupationFailures === 0) {
          crashWindow.addEvent('tally.occupation_failure', { 'tally.shard': vshard });
          crashWindow.setStatus({ code: SpanStatusCode.ERROR, message: 'marker occupation failed after the counts were written' });
        }
        occupationFailures = 1;
      },
    ));
  }
  crashWindow.end();
  const t3 = performance.now();

  return {
    vshard,
    marked,
    writeRetries,
    occupationFailures,
    countErrors,
    timings: { precheckMs: t1 - t0, writeMs: t2 - t1, occupyMs: t3 - t2 },
  };
}
