/**
 * Stream mode's batch (TALLY_SOURCE=stream): one script per shard batch
 * (lua/stream_batch.lua) applies the parts above the shard's watermarks and
 * raises them, or applies nothing and answers with the watermarks it found.
 * No marker, no receipt: a part's offset is its identity, and the watermark
 * that covers it is written with its counts.
 *
 * The common case is one call: the batch pre-aggregated into one sum per
 * count key, every part above its watermark. Only when the script answers
 * `found` are parts left out and the rest sent again:
 * - a watermark below the one the coordinator expected: Redis lost writes it
 *   had acknowledged. Nothing of that partition is applied (PART_REWIND);
 *   the coordinator replays the partition from the log (invariant 18);
 * - a watermark at or above some parts' offsets: those parts were applied
 *   before (a replay after a restart, a handover, a lost reply): PART_DONE.
 *   The rest, above it, is applied: a batch straddling the watermark is
 *   split at it, never applied or skipped whole (invariant 17).
 * Each answer leaves out a partition or at least one part, so the loop ends.
 */
import { onSlotConnection, type RedisClient } from '@tally/runtime';
import {
  describeError,
  PART_DONE,
  PART_NEW,
  PART_REWIND,
  retryUntilDone,
  ScriptReply,
  skuOfCountKey,
  watermarkKey,
  type BatchResult,
  type BatchTask,
  type CountRefusal,
  type WatermarkReport,
  type WorkerSettings,
} from '@tally/shared';
import { addToSum, type Sum } from './aggregate.js';
import type { BatchHooks, BatchLog } from './batch-log.js';
import { batchTracer, inSpan } from './batch-tracing.js';
import { countKeysOf } from './count-keys.js';
import { logRefusals } from './count-refusals.js';
import { countTtlOf } from './count-ttl.js';
import { reportingHealth } from './health-report.js';
import { loadScript, runScript, type ScriptArg } from './lua-scripts.js';
import { waitForStreamReplicas } from './replica-wait.js';

/** The batch script, its KEYS and ARGV documented in lua/stream_batch.lua. */
export const STREAM_BATCH = loadScript('stream_batch', 'redis lost the stream batch script (restart or SCRIPT FLUSH); loading it again');

/** One partition of a call: its parts still in, their lowest and highest offsets, the watermark expected. */
interface PartitionCall {
  readonly partition: number;
  lowest: number;
  highest: number;
  expected: number;
}

/** The EVALSHA arguments of one call over the parts `included`, in 'sums' or 'parts' layout. */
export function streamBatchArgs(
  settings: Pick<WorkerSettings, 'prefix' | 'countTtlS' | 'markerScope' | 'virtualShards'>,
  task: BatchTask,
  included: readonly number[],
  expected: ReadonlyMap<number, number>,
  layout: 'sums' | 'parts',
  nowMs = Date.now(),
): { args: ScriptArg[]; partitions: PartitionCall[] } {
  const positions = task.positions!;
  const calls = new Map<number, PartitionCall>();
  const skuIndex = new Map<string, number>();
  const sums: Sum[] = [];
  // 'sums' needs safe-integer deltas to add them here; 'parts' sends each change as the message had it.
  const partArgs: ScriptArg[] = [];
  for (const i of included) {
    const partition = positions.partitions[i]!;
    const offset = positions.offsets[i]!;
    const call = calls.get(partition);
    if (call === undefined) calls.set(partition, { partition, lowest: offset, highest: offset, expected: expected.get(partition) ?? -1 });
    else {
      if (offset < call.lowest) call.lowest = offset;
      if (offset > call.highest) call.highest = offset;
    }
    const part = task.changes[i]!;
    if (layout === 'parts') partArgs.push(0, part.length);
    for (const [sku, delta] of part) {
      let index = skuIndex.get(sku);
      if (index === undefined) {
        index = skuIndex.size + 1;
        skuIndex.set(sku, index);
      }
      if (layout === 'sums') sums[index - 1] = addToSum(sums[index - 1], delta);
      else partArgs.push(index, String(delta));
    }
  }
  const partitions = [...calls.values()].sort((a, b) => a.partition - b.partition);
  if (layout === 'parts') {
    // Each part's partition by its position in the list (1..g), filled now that the list is sorted.
    const position = new Map(partitions.map((call, p) => [call.partition, p + 1]));
    let at = 0;
    for (const i of included) {
      partArgs[at] = position.get(positions.partitions[i]!)!;
      at += 2 + 2 * task.changes[i]!.length;
    }
  }
  const keyOf = countKeysOf(settings, task.vshard);
  const keys: string[] = [];
  for (const sku of skuIndex.keys()) keys.push(keyOf(sku));
  const ttl = countTtlOf(settings.countTtlS);
  // Built with push: a batch of many parts exceeds the arguments a spread can take.
  const args: ScriptArg[] = [STREAM_BATCH.sha, 1 + keys.length, watermarkKey(settings.prefix, task.vshard)];
  for (const key of keys) args.push(key);
  args.push(ttl.ttlS, partitions.length, keys.length, ttl.due(keys, nowMs), layout);
  // Decimal strings: offsets are integers below 2^53, which Lua's doubles hold exactly.
  for (const call of partitions) args.push(String(call.partition), String(call.lowest), String(call.highest), String(call.expected));
  if (layout === 'sums') for (const sum of sums) args.push(String(sum));
  for (const value of partArgs) args.push(value);
  return { args, partitions };
}

export function runStreamBatch(redis: RedisClient, settings: WorkerSettings, task: BatchTask, log: BatchLog, hooks: BatchHooks = {}): Promise<BatchResult> {
  return inSpan(batchTracer(), 'tally.stream_batch', { 'tally.shard': task.vshard }, async (span) => {
    const result = await runStreamScript(redis, settings, task, log, hooks);
    span.setAttribute('tally.write_retries', result.writeRetries);
    return result;
  });
}

async function runStreamScript(redis: RedisClient, settings: WorkerSettings, task: BatchTask, log: BatchLog, hooks: BatchHooks): Promise<BatchResult> {
  const positions = task.positions;
  if (positions === undefined) throw new TypeError('a stream batch without positions');
  const t0 = performance.now();
  const n = task.changes.length;
  const marked = new Uint8Array(n).fill(PART_NEW);
  const expected = new Map(positions.expectations.map((e) => [e.partition, e.expected]));
  const reports = new Map<number, WatermarkReport>();
  const refusals: CountRefusal[] = [];
  let included = Array.from({ length: n }, (_, i) => i);
  let layout: 'sums' | 'parts' = included.every((i) => task.changes[i]!.every(([, delta]) => Number.isSafeInteger(delta))) ? 'sums' : 'parts';
  let writeRetries = 0;
  const slotKey = watermarkKey(settings.prefix, task.vshard);
  while (included.length > 0) {
    const { args, partitions } = streamBatchArgs(settings, task, included, expected, layout);
    const runOnce = reportingHealth(task.vshard, () => onSlotConnection(redis, slotKey, (connection) => runScript(connection, STREAM_BATCH, args, log)));
    const reply = (await retryUntilDone(runOnce, {
      // Only a transient failure is retried here: a lost reply is answered by
      // the watermark on the next attempt (applied, so `found`), never twice.
      giveUp: (failureClass) => failureClass !== 'transient',
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
        writeRetries++;
        log.warn({ step: 'stream_batch', vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying');
      },
    })) as unknown[];
    const outcome = reply[0];
    if (outcome === ScriptReply.STREAM_ISOLATE) {
      layout = 'parts';
      continue;
    }
    if (outcome === ScriptReply.STREAM_APPLIED) {
      await hooks.afterCountWrite?.(task);
      for (const call of partitions)
        reports.set(call.partition, { partition: call.partition, offset: call.highest, expected: call.expected, rolledBack: false });
      for (const [part, key, delta, error] of (reply[1] ?? []) as Array<[number, string, string, string]>) {
        refusals.push({
          part: included[Number(part) - 1]!,
          key: String(key),
          sku: skuOfCountKey(settings.prefix, String(key)) ?? '',
          delta: String(delta),
          error: String(error),
        });
      }
      break;
    }
    if (outcome !== ScriptReply.STREAM_FOUND || reply.length !== partitions.length + 1)
      throw new TypeError(`stream batch: the script answered ${JSON.stringify(outcome)} with ${reply.length - 1} values for ${partitions.length} partitions`);
    const found = new Map(partitions.map((call, p) => [call.partition, Number(reply[p + 1])]));
    const left: number[] = [];
    for (const i of included) {
      const partition = positions.partitions[i]!;
      const watermark = found.get(partition)!;
      const call = partitions.find((c) => c.partition === partition)!;
      if (watermark < call.expected) marked[i] = PART_REWIND;
      else if (positions.offsets[i]! <= watermark) marked[i] = PART_DONE;
      else left.push(i);
    }
    for (const call of partitions) {
      const watermark = found.get(call.partition)!;
      if (watermark < call.expected) {
        reports.set(call.partition, { partition: call.partition, offset: watermark, expected: call.expected, rolledBack: true });
        log.warn(
          { vshard: task.vshard, partition: call.partition, found: watermark, expected: call.expected },
          'a watermark is below the one this daemon had seen: Redis lost acknowledged writes; the partition is replayed from the log',
        );
      } else {
        // Raised by another daemon, or by a run of this batch whose reply was lost: what it holds is applied.
        expected.set(call.partition, watermark);
        reports.set(call.partition, { partition: call.partition, offset: watermark, expected: call.expected, rolledBack: false });
      }
    }
    included = left;
  }
  logRefusals(log, task, refusals);
  // Durability of the ack (replica-wait.ts): the watermarks it applied or found reach every part not rolled back.
  let waitTimeouts = 0;
  if (settings.waitReplicas > 0) {
    const reached = new Map<number, number>();
    for (const report of reports.values()) if (!report.rolledBack && report.offset >= 0) reached.set(report.partition, report.offset);
    if (reached.size > 0)
      waitTimeouts = await inSpan(batchTracer(), 'tally.wait_replicas', { 'tally.shard': task.vshard, 'tally.replicas': settings.waitReplicas }, () =>
        waitForStreamReplicas(redis, settings, task, reached, log, hooks.onWaitTimeout),
      );
  }
  const t1 = performance.now();
  return {
    vshard: task.vshard,
    marked,
    writeRetries,
    // No marker, no window: nothing can fail between a count write and an occupation.
    occupationFailures: 0,
    waitTimeouts,
    refusals,
    claimTakeovers: 0,
    timings: { precheckMs: 0, writeMs: t1 - t0, occupyMs: 0 },
    watermarks: [...reports.values()],
  };
}
