/**
 * The atomic batch: one server-side script per shard batch checks the
 * markers, adds only the new parts' counts and occupies their markers, as one
 * step that no crash can split.
 *
 * Two-step mode writes counts and markers in two steps, with a crash window
 * between them. Redis runs a script atomically over keys that share
 * a hash slot, and every key of a virtual shard carries the hash tag
 * `{<vshard>}` (keys.ts), so the script is single-slot on Redis Cluster too.
 * There is no crash window left: a crash before the script leaves nothing
 * written, a crash after it leaves counts and markers written together, and a
 * second daemon running the same message at the same moment is serialised by
 * Redis and finds the first one's markers.
 *
 * How the script reaches Redis: lua-scripts.ts, as for the two-step
 * scripts (EVALSHA; SCRIPT LOAD on NOSCRIPT; a reload after the first logged).
 */
import { onSlotConnection, type RedisClient } from '@tally/runtime';
import {
  describeError,
  markerBaseKey,
  markerFilterBits,
  parsePartFlags,
  receiptKey,
  retryUntilDone,
  ScriptReply,
  taskDigests,
  type BatchResult,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { loadScript, runScript, type ScriptArg } from './lua-scripts.js';
import { addToSum, type Sum } from './aggregate.js';
import { countKeysOf } from './count-keys.js';
import { countTtlOf } from './count-ttl.js';
import { reportingHealth } from './health-report.js';
import type { BatchHooks, BatchLog } from './batch-log.js';
import { batchTracer, inSpan } from './batch-tracing.js';
import { decodeRefusals, logRefusals } from './count-refusals.js';
import { waitForReplicas } from './replica-wait.js';
import { NO_VOUCHED_BUCKETS, settledFiltersOf, type VouchedBuckets } from './settled-filters.js';

/** The batch script, its KEYS and ARGV documented in lua/atomic_batch.lua. */
export const ATOMIC_BATCH = loadScript('atomic_batch', 'redis lost the atomic batch script (restart or SCRIPT FLUSH); loading it again');
export const ATOMIC_BATCH_SHA = ATOMIC_BATCH.sha;

/** The EVALSHA arguments of a batch after the command name: SHA, number of keys, keys, then ARGV as documented in the script. */
export function atomicBatchArgs(
  settings: Pick<
    WorkerSettings,
    'prefix' | 'markerTtlS' | 'countTtlS' | 'markerBucketS' | 'markerSubBuckets' | 'markerScope' | 'markerFilterBits' | 'virtualShards'
  >,
  task: BatchTask,
  batchId: string,
  vouched: VouchedBuckets = NO_VOUCHED_BUCKETS,
): ScriptArg[] {
  const { prefix, markerTtlS, countTtlS } = settings;
  const { vshard, changes } = task;
  const skuIndex = new Map<string, number>();
  // By count key index - 1: the sum of its deltas over all parts, and how many changes name it.
  const sums: Sum[] = [];
  const named: number[] = [];
  // 'sums' unless a delta is not a safe integer (it cannot be summed exactly here): then the script checks every change.
  let safe = true;
  const partArgs: ScriptArg[] = [];
  const digests = taskDigests(task);
  for (let i = 0; i < changes.length; i++) {
    const part = changes[i]!;
    // One argument per part, 'index:delta,...': the script reads it only for a duplicate or a refused part.
    let text = '';
    for (const [sku, delta] of part) {
      let index = skuIndex.get(sku);
      if (index === undefined) {
        index = skuIndex.size + 1;
        skuIndex.set(sku, index);
        named.push(0);
      }
      if (!Number.isSafeInteger(delta)) safe = false;
      else sums[index - 1] = addToSum(sums[index - 1], delta);
      named[index - 1]!++;
      // Decimal text, so the script never sees a JavaScript double it would have to print back.
      text += text === '' ? `${index}:${delta}` : `,${index}:${delta}`;
    }
    partArgs.push(digests[i] as Buffer, text);
  }
  // Built with push, not spread: a batch of 100,000 parts exceeds the arguments a call can take.
  const args: ScriptArg[] = [ATOMIC_BATCH_SHA, 2 + skuIndex.size, receiptKey(prefix, vshard, batchId), markerBaseKey(prefix, vshard)];
  const keys: string[] = [];
  const keyOf = countKeysOf(settings, vshard);
  for (const sku of skuIndex.keys()) keys.push(keyOf(sku));
  for (const key of keys) args.push(key);
  const ttl = countTtlOf(countTtlS);
  args.push(
    markerTtlS,
    ttl.ttlS,
    changes.length,
    skuIndex.size,
    settings.markerBucketS,
    settings.markerSubBuckets,
    safe ? 'sums' : 'parts',
    ttl.due(keys, Date.now()),
    markerFilterBits(settings.markerScope, settings.markerFilterBits),
    vouched.buckets,
    vouched.flags,
  );
  if (safe) {
    // Decimal strings: exact past 2^53 (a bigint), and never a double the script would have to print back.
    for (const sum of sums) args.push(String(sum));
    for (const count of named) args.push(count);
  }
  for (const value of partArgs) args.push(value);
  return args;
}

/** The atomic batch is one script call: one span, `tally.atomic_batch`, in place of the two-step's four. */
export function runAtomicBatch(redis: RedisClient, settings: WorkerSettings, task: BatchTask, log: BatchLog, hooks: BatchHooks = {}): Promise<BatchResult> {
  return inSpan(batchTracer(), 'tally.atomic_batch', { 'tally.shard': task.vshard }, async (span) => {
    const result = await runAtomicScript(redis, settings, task, log, hooks);
    span.setAttribute('tally.write_retries', result.writeRetries);
    return result;
  });
}

async function runAtomicScript(redis: RedisClient, settings: WorkerSettings, task: BatchTask, log: BatchLog, hooks: BatchHooks): Promise<BatchResult> {
  const t0 = performance.now();
  // The coordinator's batch id, the same for every attempt and every rerun of
  // this batch: a retry after a lost reply, or a rerun after this thread
  // died, finds the receipt the first run left and gets its answer back.
  // On the master of the shard's slot (every key carries the hash tag {vshard}): see onSlotConnection.
  const shardKey = markerBaseKey(settings.prefix, task.vshard);
  // Settled buckets' filters are probed here, from this thread's copies (settled-filters.ts).
  const settled = markerFilterBits(settings.markerScope, settings.markerFilterBits) > 0 ? settledFiltersOf(settings.markerBucketS, settings.markerTtlS) : null;
  const args = atomicBatchArgs(settings, task, task.batchId, settled?.vouch(shardKey, taskDigests(task)));
  let writeRetries = 0;
  const runOnce = reportingHealth(task.vshard, () =>
    onSlotConnection(redis, shardKey, async (connection) => {
      const reply = (await runScript(connection, ATOMIC_BATCH, args, log)) as [string, unknown, number, number?];
      if (reply[3] !== undefined)
        settled?.observe(shardKey, reply[3], connection, (error) =>
          log.warn({ vshard: task.vshard, err: describeError(error) }, 'could not copy a settled marker filter; the batch script probes that bucket itself'),
        );
      return reply;
    }),
  );
  const reply = (await retryUntilDone(runOnce, {
    // A `fatal` or `data` reply (a bad argument, NOPERM, a bug) would fail
    // the same way here: it goes to the coordinator, which retries a `fatal`
    // one visibly and isolates a `data` one, acking nothing of it meanwhile.
    // Nothing was written: the script checks before its first write. (A
    // refused increment is not an error: the script isolates it itself.)
    giveUp: (failureClass) => failureClass !== 'transient',
    // A lost connection or a transient reply: the script may or may not
    // have run; the receipt answers that on the next attempt.
    onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
      writeRetries++;
      log.warn({ step: 'atomic_batch', vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying');
    },
  })) as [string, unknown, number];
  const [flags, rawRefusals, replayed] = reply;
  if (replayed !== ScriptReply.ATOMIC_REPLAYED) await hooks.afterCountWrite?.(task);
  const marked = parsePartFlags(flags, task.changes.length, 'atomic');
  const refusals = decodeRefusals(rawRefusals, settings.prefix);
  logRefusals(log, task, refusals);
  // Durability of the ack (replica-wait.ts): every part not refused has a
  // marker, done by this batch or found done, and relies on it.
  let waitTimeouts = 0;
  const reliedOn: Uint8Array[] = [];
  if (settings.waitReplicas > 0) {
    const digests = taskDigests(task);
    for (let i = 0; i < flags.length; i++) if (flags[i] !== ScriptReply.ATOMIC_REFUSED) reliedOn.push(digests[i]!);
  }
  if (reliedOn.length > 0) {
    waitTimeouts = await inSpan(batchTracer(), 'tally.wait_replicas', { 'tally.shard': task.vshard, 'tally.replicas': settings.waitReplicas }, () =>
      waitForReplicas(redis, settings, task, reliedOn, log, hooks.onWaitTimeout),
    );
  }
  const t1 = performance.now();
  return {
    vshard: task.vshard,
    marked,
    writeRetries,
    // There is no step between the count write and the marker occupation for
    // a crash to fall into: always 0 here, reported as not applicable (null)
    // by `tally stats` for an atomic prefix.
    occupationFailures: 0,
    waitTimeouts,
    refusals,
    // No claims in atomic mode: the script is the whole batch.
    claimTakeovers: 0,
    // One step: it is the count write and the marker occupation at once.
    timings: { precheckMs: 0, writeMs: t1 - t0, occupyMs: 0 },
  };
}
