/**
 * The two-step batch: claim markers, write counts, occupy markers.
 *
 *   EVALSHA claim_markers  (HMGET live buckets, HSET batch no.) -> which parts are new, held or done
 *   EVALSHA write_counts   (INCRBY/EXPIRE … receipt)            -> counts written (all or none)
 *   EVALSHA occupy_markers (the batch's record -> done)         -> markers occupied
 *
 * The order is the point (invariant 2): a marker is occupied only after its
 * counts are written. A crash between the two double-counts on redelivery,
 * which the counters make visible; the reverse order would lose the counts
 * invisibly. The window between them is one per shard batch, not one per
 * message.
 *
 * The claim closes a race between daemons: two daemons handed copies of one
 * message at the same instant both used to miss the marker and both count.
 * Now the pre-check claims each new part in the same script that reads the
 * markers, so the second daemon sees a live claim and holds its part back
 * (PART_HELD) until the first has occupied the marker. A claim is not a
 * marker: a crash after the claim and before the count write loses nothing,
 * the claim runs out after the claim TTL and the redelivery counts it.
 */
import { randomUUID } from 'node:crypto';
import { SpanStatusCode, trace } from '@opentelemetry/api';
import type { Redis } from 'ioredis';
import {
  countKey,
  describeError,
  markerBaseKey,
  taskDigests,
  parsePartFlags,
  PART_NEW,
  receiptKey,
  retryUntilDone,
  type BatchResult,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { aggregateNewParts } from './aggregate.js';
import type { BatchHooks, BatchLog } from './batch-log.js';
import { batchTracer, inSpan } from './batch-tracing.js';
import { evalshaArgs, loadScript, runScript } from './lua-scripts.js';
import { reportingHealth } from './health-report.js';

/** The claim, the count write and the marker occupation, their KEYS and ARGV documented in lua/*.lua. */
export const CLAIM_MARKERS = loadScript('claim_markers');
export const WRITE_COUNTS = loadScript('write_counts');
export const OCCUPY_MARKERS = loadScript('occupy_markers');

/**
 * Retries an idempotent step until it succeeds: outages wait, they do not
 * drop (invariant 8). Every failure is retried today, `data` and `fatal` ones
 * too, but each is logged with its class.
 */
function untilDone<T>(step: string, task: BatchTask, log: BatchLog, run: () => Promise<T>, onFailure?: () => void): Promise<T> {
  return retryUntilDone(reportingHealth(task.vshard, run), {
    onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
      onFailure?.();
      const span = trace.getActiveSpan();
      span?.addEvent('tally.redis_error', { 'tally.step': step, 'tally.attempt': attempt, 'exception.message': describeError(error) });
      span?.setStatus({ code: SpanStatusCode.ERROR, message: `redis error in ${step}: ${describeError(error)}` });
      log.warn({ step, vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying');
    },
  });
}

export async function runTwoStepBatch(redis: Redis, settings: WorkerSettings, task: BatchTask, log: BatchLog, hooks: BatchHooks = {}): Promise<BatchResult> {
  const { prefix, markerTtlS, countTtlS, markerBucketS, markerSubBuckets } = settings;
  const { vshard, changes } = task;
  const markerBase = markerBaseKey(prefix, vshard);
  const digests = taskDigests(task) as Buffer[];
  const bucketArgs = [markerBucketS, markerTtlS, markerSubBuckets];

  const tracer = batchTracer();
  const t0 = performance.now();
  // Claims are retried with the same token: a claim this daemon made on an
  // attempt whose reply was lost is its own, and is taken again.
  const claimArgs = evalshaArgs(CLAIM_MARKERS, [markerBase], [...bucketArgs, settings.claimToken, settings.claimTtlMs, ...digests]);
  const [flags, claimBucket, claimTakeovers, claimBatch] = await inSpan(tracer, 'tally.precheck', { 'tally.shard': vshard, 'tally.markers': changes.length }, () =>
    untilDone('precheck', task, log, async () => (await runScript(redis, CLAIM_MARKERS, claimArgs, log)) as [string, number, number, number]),
  );
  if (claimTakeovers > 0) log.warn({ vshard, claimTakeovers }, "took over parts whose claim by another daemon had run out (it died or stalled); counted here");
  const marked = parsePartFlags(flags, changes.length);
  const t1 = performance.now();

  const sums = aggregateNewParts(changes, (i) => marked[i] === PART_NEW);
  // The window opens with the count write and closes when the markers are
  // occupied; its span is a sibling of the two step spans it spans.
  const crashWindow = tracer.startSpan('tally.crash_window', { attributes: { 'tally.shard': vshard } });
  let writeRetries = 0;
  let countErrors = 0;
  if (sums.size > 0) {
    const keys = [receiptKey(prefix, vshard, randomUUID())];
    const argv: string[] = [String(countTtlS), String(markerTtlS)];
    for (const [sku, sum] of sums) {
      keys.push(countKey(prefix, vshard, sku));
      argv.push(sum.toString());
    }
    // Built once: every attempt sends the same receipt, so a retry after a
    // reply that never came finds the receipt and writes nothing twice.
    const args = evalshaArgs(WRITE_COUNTS, keys, argv);
    countErrors = await inSpan(tracer, 'tally.write_counts', { 'tally.shard': vshard, 'tally.skus.distinct': sums.size }, () =>
      untilDone(
        'write_counts',
        task,
        log,
        async () => {
          const [refused] = (await runScript(redis, WRITE_COUNTS, args, log)) as [number, number];
          return refused;
        },
        () => {
          writeRetries++;
        },
      ),
    );
    if (countErrors > 0) {
      log.error({ vshard, countErrors }, 'redis refused count increments (overflow or a non-integer value in a count key)');
    }
  }
  const t2 = performance.now();

  await hooks.afterCountWrite?.(task);

  let occupationFailures = 0;
  if (claimBatch > 0) {
    // The batch's record turns done in one write; the digests travel only
    // when time has moved to a later bucket and the markers must follow (-1).
    const args = evalshaArgs(OCCUPY_MARKERS, [markerBase], [...bucketArgs, claimBucket, claimBatch]);
    await inSpan(tracer, 'tally.occupy_markers', { 'tally.shard': vshard }, () =>
      untilDone(
        'occupy_markers',
        task,
        log,
        async () => {
          if ((await runScript(redis, OCCUPY_MARKERS, args, log)) !== -1) return;
          const newDigests: Buffer[] = [];
          for (let i = 0; i < changes.length; i++) if (marked[i] === PART_NEW) newDigests.push(digests[i]!);
          await runScript(redis, OCCUPY_MARKERS, evalshaArgs(OCCUPY_MARKERS, [markerBase], [...bucketArgs, claimBucket, claimBatch, ...newDigests]), log);
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
      ),
    );
  }
  crashWindow.end();
  const t3 = performance.now();

  return {
    vshard,
    marked,
    writeRetries,
    occupationFailures,
    countErrors,
    claimTakeovers,
    timings: { precheckMs: t1 - t0, writeMs: t2 - t1, occupyMs: t3 - t2 },
  };
}
