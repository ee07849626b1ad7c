/**
 * The two-step batch: pre-check markers, write counts, occupy markers.
 *
 *   MGET markers                               -> which parts are new
 *   EVALSHA write_counts (INCRBY/EXPIRE … receipt) -> counts written (all or none)
 *   EVALSHA occupy_markers (SET marker EX …)   -> markers occupied
 *
 * The order is the point (invariant 2): a marker is occupied only after its
 * counts are written. A crash between the two double-counts on redelivery,
 * which the counters make visible; the reverse order would lose the counts
 * invisibly. The window between them is one per shard batch, not one per
 * message.
 *
 * Every step goes to the master of the shard's slot (onSlotConnection: on a
 * cluster, one slot per virtual shard; on a standalone Redis, the one
 * connection). With TALLY_REDIS_WAIT_REPLICAS the batch ends with WAIT on
 * the connection that wrote it (replica-wait.ts).
 */
import { randomUUID } from 'node:crypto';
import { SpanStatusCode, trace } from '@opentelemetry/api';
import { countKey, describeError, retryUntilDone, markerKey, receiptKey, type BatchResult, type BatchTask, type WorkerSettings } from '@tally/shared';
import { markConnection, onSlotConnection, type ConnectionMark, type RedisClient } from '@tally/runtime';
import { aggregateNewParts, selectNewParts } from './aggregate.js';
import type { BatchHooks, BatchLog } from './batch-log.js';
import { batchTracer, inSpan } from './batch-tracing.js';
import { evalshaArgs, loadScript, runScript } from './lua-scripts.js';
import { reportingHealth } from './health-report.js';
import { confirmReplicated, replicaWaitOf } from './replica-wait.js';

/** The count write and the marker occupation, their KEYS and ARGV documented in lua/*.lua. */
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

export async function runTwoStepBatch(
  redis: RedisClient,
  settings: WorkerSettings,
  task: BatchTask,
  log: BatchLog,
  hooks: BatchHooks = {},
): Promise<BatchResult> {
  const { prefix, markerTtlS, countTtlS } = settings;
  const { vshard, ids, changes } = task;
  const markerKeys = ids.map((id) => markerKey(prefix, vshard, id));
  // Any key of the shard names its slot: they all carry the hash tag {vshard}.
  const shardKey = markerKey(prefix, vshard, '');
  // The connection each write went out on, for WAIT (replica-wait.ts).
  let writeMark: ConnectionMark | null = null;
  let occupyMark: ConnectionMark | null = null;

  const tracer = batchTracer();
  const t0 = performance.now();
  const values = await inSpan(tracer, 'tally.precheck', { 'tally.shard': vshard, 'tally.markers': markerKeys.length }, () =>
    untilDone('precheck', task, log, () => onSlotConnection(redis, shardKey, (connection) => connection.mget(markerKeys))),
  );
  const marked = selectNewParts(ids, values);
  const t1 = performance.now();

  const sums = aggregateNewParts(changes, (i) => marked[i] === 0);
  // The window opens with the count write and closes when the markers are
  // occupied; its span is a sibling of the two step spans it spans.
  const crashWindow = tracer.startSpan('tally.crash_window', { attributes: { 'tally.shard': vshard } });
  let writeRetries = 0;
  let countErrors = 0;
  let writeArgs: Array<string | number> | null = null;
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
    writeArgs = args;
    countErrors = await inSpan(tracer, 'tally.write_counts', { 'tally.shard': vshard, 'tally.skus.distinct': sums.size }, () =>
      untilDone(
        'write_counts',
        task,
        log,
        () =>
          onSlotConnection(redis, shardKey, async (connection) => {
            const mark = markConnection(connection);
            const [refused] = (await runScript(connection, WRITE_COUNTS, args, log)) as [number, number];
            writeMark = mark;
            return refused;
          }),
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
  const newMarkers: string[] = [];
  for (let i = 0; i < ids.length; i++) if (marked[i] === 0) newMarkers.push(markerKeys[i]!);
  const occupyArgs = newMarkers.length > 0 ? evalshaArgs(OCCUPY_MARKERS, newMarkers, [markerTtlS]) : null;
  if (occupyArgs !== null) {
    const args = occupyArgs;
    await inSpan(tracer, 'tally.occupy_markers', { 'tally.shard': vshard }, () =>
      untilDone(
        'occupy_markers',
        task,
        log,
        () =>
          onSlotConnection(redis, shardKey, async (connection) => {
            const mark = markConnection(connection);
            await runScript(connection, OCCUPY_MARKERS, args, log);
            occupyMark = mark;
          }),
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
  // Taken before WAIT: the crash window (and occupyMs) ends when the markers are occupied.
  const t3 = performance.now();

  const wait = replicaWaitOf(settings);
  if (wait !== null && (writeArgs !== null || occupyArgs !== null)) {
    // One connection for both writes, or none: WAIT must cover them both.
    const written = writeArgs === null ? occupyMark : occupyArgs === null || sameMark(writeMark, occupyMark) ? writeMark : null;
    await inSpan(tracer, 'tally.wait_replicas', { 'tally.shard': vshard, 'tally.replicas': wait.replicas }, () =>
      confirmReplicated(
        redis,
        shardKey,
        wait,
        written,
        async (connection) => {
          if (writeArgs !== null) await runScript(connection, WRITE_COUNTS, writeArgs, log);
          if (occupyArgs !== null) await runScript(connection, OCCUPY_MARKERS, occupyArgs, log);
        },
        task,
        log,
      ),
    );
  }

  return {
    vshard,
    marked,
    writeRetries,
    occupationFailures,
    countErrors,
    timings: { precheckMs: t1 - t0, writeMs: t2 - t1, occupyMs: t3 - t2 },
  };
}

function sameMark(a: ConnectionMark | null, b: ConnectionMark | null): boolean {
  return a !== null && b !== null && a.connection === b.connection && a.generation === b.generation;
}
