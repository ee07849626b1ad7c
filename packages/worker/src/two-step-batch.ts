/**
 * The two-step batch: claim markers, write counts, occupy markers.
 *
 *   EVALSHA claim_markers  (HMGET live buckets, HSET batch no.) -> which parts are new, held or done
 *   EVALSHA write_counts   (INCRBY/EXPIRE … receipt)            -> counts written (all or none)
 *   EVALSHA occupy_markers (the batch's record -> done)         -> markers occupied, if the receipt is there
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
 *
 * Every step runs on the connection to the master of the shard's slot
 * (onSlotConnection; on a standalone Redis, the one connection), so a
 * NOSCRIPT reload reaches the node that runs the script. With
 * message-scoped markers on a Redis Cluster the counts are in other slots
 * than the marker: step 2 is then one write per count shard
 * (cross-slot-counts.ts), all done before step 3.
 */
import { randomUUID } from 'node:crypto';
import { SpanStatusCode, trace } from '@opentelemetry/api';
import {
  describeError,
  retryUntilDone,
  markerBaseKey,
  markerFilterBits,
  PART_HELD,
  PART_NEW,
  receiptKey,
  ScriptReply,
  taskDigests,
  WindowGauge,
  type BatchResult,
  type BatchTask,
  type CountRefusal,
  type WorkerSettings,
} from '@tally/shared';
import { onSlotConnection, type RedisClient } from '@tally/runtime';
import { aggregateNewParts } from './aggregate.js';
import { shardWritesOf, writeCountsAcrossSlots } from './cross-slot-counts.js';
import { countKeysOf } from './count-keys.js';
import { countTtlOf } from './count-ttl.js';
import { claimParts } from './claim-parts.js';

export { CLAIM_MARKERS } from './claim-parts.js';
import type { BatchHooks, BatchLog } from './batch-log.js';
import { batchTracer, inSpan } from './batch-tracing.js';
import { decodeRefusals, logRefusals } from './count-refusals.js';
import { evalshaArgs, loadScript, runScript, type ScriptArg } from './lua-scripts.js';
import { reportingHealth } from './health-report.js';
import { BatchWritesLostError, waitForReplicas } from './replica-wait.js';
import { BatchFencedError, heldByShard } from './fenced-adoption.js';

/** The count write and the marker occupation, their KEYS and ARGV documented in lua/*.lua (the claim: claim-parts.ts). */
export const WRITE_COUNTS = loadScript('write_counts');
export const OCCUPY_MARKERS = loadScript('occupy_markers');

/** write_counts.lua's reply: outcome, refused parts, refusals (documented in the script). */
type WriteCountsReply = [typeof ScriptReply.WRITE_WRITTEN | typeof ScriptReply.WRITE_RECEIPT | typeof ScriptReply.WRITE_ISOLATE, string, unknown];

/**
 * Retries an idempotent step until it succeeds: outages wait, they do not
 * drop (invariant 8). A `fatal` refusal (NOPERM...) is retried here too,
 * visibly (logged, and reported to the coordinator's readiness). A `data`
 * failure would fail the same way on every attempt: it goes to the
 * coordinator at once, which isolates it. Every step fails before its first
 * write for such a reason, or is idempotent, so giving up leaves nothing half done.
 */
function untilDone<T>(step: string, task: BatchTask, log: BatchLog, run: () => Promise<T>, onFailure?: () => void): Promise<T> {
  return retryUntilDone(reportingHealth(task.vshard, run), {
    giveUp: (failureClass) => failureClass === 'data',
    onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
      onFailure?.();
      const span = trace.getActiveSpan();
      span?.addEvent('tally.redis_error', { 'tally.step': step, 'tally.attempt': attempt, 'exception.message': describeError(error) });
      span?.setStatus({ code: SpanStatusCode.ERROR, message: `redis error in ${step}: ${describeError(error)}` });
      log.warn({ step, vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying');
    },
  });
}

/** One view per buffer: a thread's settings, and so its gauge, never change. */
const gauges = new WeakMap<SharedArrayBuffer, WindowGauge>();
function gaugeOf(settings: WorkerSettings): WindowGauge | null {
  const buffer = settings.windowGauge;
  if (buffer === undefined) return null;
  let gauge = gauges.get(buffer);
  if (gauge === undefined) gauges.set(buffer, (gauge = new WindowGauge(buffer)));
  return gauge;
}

/** Messages the new parts stand for: each part weighs its share of its message (1 when the task carries no shares). */
function newMessages(task: BatchTask, marked: Uint8Array): number {
  let messages = 0;
  for (let i = 0; i < marked.length; i++) if (marked[i] === PART_NEW) messages += task.shares?.[i] ?? 1;
  return messages;
}

export async function runTwoStepBatch(
  redis: RedisClient,
  settings: WorkerSettings,
  task: BatchTask,
  log: BatchLog,
  hooks: BatchHooks = {},
): Promise<BatchResult> {
  for (;;) {
    try {
      return await runOnce(redis, settings, task, log, hooks);
    } catch (error) {
      if (!(error instanceof BatchFencedError)) throw error;
      // Fenced adoption: another batch took this one's claims over while it stalled, and fenced it out of a count
      // shard. Nothing was occupied and what it wrote stands; under a new id the batch adopts its own claims and
      // writes only what nobody counted (fenced-adoption.ts). Not the coordinator's rerun: that keeps the id.
      log.warn({ vshard: task.vshard, batchId: task.batchId, err: error.message }, 'batch fenced out by an adopter; running it again under a new batch id');
      task = { ...task, batchId: randomUUID() };
    }
  }
}

async function runOnce(redis: RedisClient, settings: WorkerSettings, task: BatchTask, log: BatchLog, hooks: BatchHooks): Promise<BatchResult> {
  const { prefix, markerTtlS, countTtlS, markerBucketS, markerSubBuckets } = settings;
  const { vshard, changes } = task;
  const parts = changes.length;
  const fenced = settings.fencedAdoption === true;
  const digests = taskDigests(task) as Buffer[];
  // The shard's marker base names its slot (hash tag {vshard}): every step runs on that slot's master.
  const shardKey = markerBaseKey(prefix, vshard);
  const receipt = receiptKey(prefix, vshard, task.batchId);
  const bucketArgs = [markerBucketS, markerTtlS, markerSubBuckets, markerFilterBits(settings.markerScope, settings.markerFilterBits)];

  const tracer = batchTracer();
  const t0 = performance.now();
  // Claims are retried with the same token: a claim this daemon made on an
  // attempt whose reply was lost is its own, and is taken again.
  const claimed = await inSpan(tracer, 'tally.precheck', { 'tally.shard': vshard, 'tally.markers': parts }, () =>
    untilDone('precheck', task, log, () =>
      onSlotConnection(redis, shardKey, (connection) =>
        claimParts({ connection, settings, shardKey, digests, bucketArgs, log, ...(fenced ? { adoptingAs: task.batchId } : {}) }),
      ),
    ),
  );
  const { marked, claims } = claimed;
  const claimTakeovers = claimed.takeovers;
  if (claimTakeovers > 0) {
    log.warn(
      { vshard, claimTakeovers },
      fenced
        ? 'adopted parts whose claim by another daemon had run out (it died or stalled): counted here where it had not counted them'
        : 'took over parts whose claim by another daemon had run out (it died or stalled); counted here',
    );
  }
  const t1 = performance.now();

  // Message-scoped markers on a cluster: the batch's counts span slots, and
  // are summed per count shard (cross-slot-counts.ts); on one slot, per SKU.
  // Fenced adoption's counts are always written per count shard, under the receipts adopters read.
  const crossSlot = settings.markerScope === 'message' && (settings.redisTopology === 'cluster' || fenced);
  const shardWrites = crossSlot ? shardWritesOf(task, marked, settings) : null;
  const sums = shardWrites === null ? aggregateNewParts(changes, (i) => marked[i] === PART_NEW) : null;
  // A SKU's count lives on one shard: the shards' sums together hold each SKU once.
  const distinctSkus = sums?.size ?? shardWrites!.reduce((n, write) => n + write.sums.size, 0);
  // Fenced adoption closes the crash window: a kill in it re-counts nothing, so nothing is at risk there.
  const gauge = fenced ? null : gaugeOf(settings);
  let windowMessages = distinctSkus > 0 ? newMessages(task, marked) : 0;
  // The window opens with the count write and closes when the markers are
  // occupied; its span is a sibling of the two step spans it spans.
  const crashWindow = tracer.startSpan('tally.crash_window', { attributes: { 'tally.shard': vshard } });
  let writeRetries = 0;
  let refusals: CountRefusal[] = [];
  let wroteCounts = false;
  let waitTimeouts = 0;
  let adoptedParts = 0;
  if (distinctSkus > 0) await hooks.beforeCountWrite?.(task);
  if (shardWrites !== null && shardWrites.length > 0) {
    gauge?.open(vshard, windowMessages);
    const written = await inSpan(tracer, 'tally.write_counts', { 'tally.shard': vshard, 'tally.skus.distinct': distinctSkus }, () =>
      writeCountsAcrossSlots({
        redis,
        settings,
        task,
        groups: shardWrites,
        chains: claimed.chains,
        ...(fenced ? { held: heldByShard(task, marked, settings.virtualShards!) } : {}),
        writeCounts: WRITE_COUNTS,
        log,
        untilDone: (step, run, onFailure) => untilDone(step, task, log, run, onFailure),
        ...(hooks.onWaitTimeout === undefined ? {} : { onWaitTimeout: hooks.onWaitTimeout }),
        ...(hooks.onUndoFailed === undefined ? {} : { onUndoFailed: hooks.onUndoFailed }),
      }),
    );
    writeRetries = written.retries;
    waitTimeouts = written.waitTimeouts;
    wroteCounts = written.wrote;
    refusals = written.refusals;
    adoptedParts = written.adoptedParts;
  } else if (sums !== null && sums.size > 0) {
    const keys = [receipt];
    const ttl = countTtlOf(countTtlS);
    const keyOf = countKeysOf(settings, vshard);
    const sumArgv: string[] = [String(ttl.ttlS), String(markerTtlS), 'sums', ''];
    const keyIndex = new Map<string, number>();
    for (const [sku, sum] of sums) {
      keys.push(keyOf(sku));
      keyIndex.set(sku, keys.length - 1);
      sumArgv.push(sum.toString());
    }
    sumArgv[3] = ttl.due(keys.slice(1), Date.now());
    // Built once: every attempt sends the same receipt, so a retry after a
    // reply that never came finds the receipt and writes nothing twice.
    const write = (args: ScriptArg[]): Promise<WriteCountsReply> =>
      untilDone(
        'write_counts',
        task,
        log,
        () => onSlotConnection(redis, shardKey, async (connection) => (await runScript(connection, WRITE_COUNTS, args, log)) as WriteCountsReply),
        () => {
          writeRetries++;
        },
      );
    // From the moment the write leaves, a SIGKILL re-counts these parts.
    gauge?.open(vshard, windowMessages);
    let reply = await inSpan(tracer, 'tally.write_counts', { 'tally.shard': vshard, 'tally.skus.distinct': sums.size }, () =>
      write(evalshaArgs(WRITE_COUNTS, keys, sumArgv)),
    );
    if (reply[0] === ScriptReply.WRITE_ISOLATE) {
      // Redis refused one of the sums, and nothing was written: the same
      // write again with each new part as its own all-or-nothing group, so
      // only the parts Redis refuses are left out.
      const partArgv: Array<string | number> = [ttl.ttlS, markerTtlS, 'parts', parts];
      for (let i = 0; i < parts; i++) {
        if (marked[i] !== PART_NEW) continue;
        const part = changes[i]!;
        partArgv.push(i + 1, part.length);
        for (const [sku, delta] of part) partArgv.push(keyIndex.get(sku)!, String(delta));
      }
      reply = await inSpan(tracer, 'tally.write_counts', { 'tally.shard': vshard, 'tally.parts': parts }, () =>
        write(evalshaArgs(WRITE_COUNTS, keys, partArgv)),
      );
    }
    wroteCounts = reply[0] === ScriptReply.WRITE_WRITTEN;
    refusals = decodeRefusals(reply[2], prefix);
  }
  logRefusals(log, task, refusals);
  // A refused part counted nothing: it is not in the window.
  if (refusals.length > 0) {
    for (const refusal of refusals) windowMessages -= task.shares?.[refusal.part] ?? 1;
    gauge?.open(vshard, Math.max(0, windowMessages));
  }
  const t2 = performance.now();

  if (wroteCounts) await hooks.afterCountWrite?.(task);

  let occupationFailures = 0;
  // A refused part counted nothing: its claim is deleted, so it gets no
  // marker and its replay counts it.
  const refused = new Set(refusals.map((refusal) => refusal.part));
  if (claims.length > 0) {
    // Per claim (a batch has one, or two when the pipeline claimed some parts
    // and the script others: claim-parts.ts), the batch's record turns done
    // in one write; the new parts' digests travel only when time has moved
    // to a later bucket and the markers must follow (OCCUPY_NEEDS_DIGESTS).
    // With counts written, the receipt must still be there (OCCUPY_RECEIPT_GONE otherwise): see occupy_markers.lua.
    // Across slots the receipts are in the count shards' slots, out of the script's reach: they were checked (and WAITed for) before.
    const occupyKeys = distinctSkus > 0 && !crossSlot ? [shardKey, receipt] : [shardKey];
    const occupations = claims.map((claim) => {
      const refusedDigests = claim.parts.filter((i) => refused.has(i)).map((i) => digests[i]!);
      return {
        args: evalshaArgs(OCCUPY_MARKERS, occupyKeys, [...bucketArgs, claim.bucket, claim.batch, refusedDigests.length, ...refusedDigests]),
        // The call that follows OCCUPY_NEEDS_DIGESTS: the refused claims are deleted already, the others' markers move.
        moving: (): ScriptArg[] =>
          evalshaArgs(OCCUPY_MARKERS, occupyKeys, [
            ...bucketArgs,
            claim.bucket,
            claim.batch,
            0,
            ...claim.parts.filter((i) => !refused.has(i)).map((i) => digests[i]!),
          ]),
      };
    });
    // Once the write leaves, a SIGKILL no longer re-counts these parts (Redis runs what it was sent).
    gauge?.close(vshard);
    const occupied = await inSpan(tracer, 'tally.occupy_markers', { 'tally.shard': vshard }, () =>
      untilDone(
        'occupy_markers',
        task,
        log,
        () =>
          onSlotConnection(redis, shardKey, async (connection) => {
            // Sent together (one connection pipelines them): all of the batch's occupations leave at once.
            const replies = await Promise.all(
              occupations.map(async ({ args, moving }) => {
                const first = await runScript(connection, OCCUPY_MARKERS, args, log);
                return first === ScriptReply.OCCUPY_NEEDS_DIGESTS ? runScript(connection, OCCUPY_MARKERS, moving(), log) : first;
              }),
            );
            return replies.includes(ScriptReply.OCCUPY_RECEIPT_GONE) ? ScriptReply.OCCUPY_RECEIPT_GONE : replies[0];
          }),
        () => {
          // The counts are written and the markers are not: the crash window
          // is open for this batch until a retry succeeds. Counted once per batch.
          gauge?.open(vshard, windowMessages);
          if (occupationFailures === 0) {
            crashWindow.addEvent('tally.occupation_failure', { 'tally.shard': vshard });
            crashWindow.setStatus({ code: SpanStatusCode.ERROR, message: 'marker occupation failed after the counts were written' });
          }
          occupationFailures = 1;
        },
      ),
    );
    if (occupied === ScriptReply.OCCUPY_RECEIPT_GONE) {
      // The receipt, and so the counts, are not on the server this step
      // reached: a failover (or a restart without persistence) lost them
      // after they were written. No marker was set; the coordinator reruns
      // the batch under its id, and the rerun writes the counts again.
      gauge?.close(vshard);
      crashWindow.end();
      throw new BatchWritesLostError(`the batch's receipt ${receipt} (and so its counts) is`);
    }
  }
  gauge?.close(vshard);
  crashWindow.end();
  const t3 = performance.now();

  // Durability of the ack: the batch returns only once the replicas have its
  // writes (replica-wait.ts), and every marker it relies on is done on the
  // master they replicate: occupied now, or found done (a duplicate, which is
  // acked on the strength of that marker); not a held part's (it is not acked
  // now) nor a refused one's (it has no marker).
  const reliedOn = settings.waitReplicas > 0 ? digests.filter((_, i) => marked[i] !== PART_HELD && !refused.has(i)) : [];
  if (reliedOn.length > 0) {
    waitTimeouts += await inSpan(tracer, 'tally.wait_replicas', { 'tally.shard': vshard, 'tally.replicas': settings.waitReplicas }, () =>
      waitForReplicas(redis, settings, task, reliedOn, log, hooks.onWaitTimeout),
    );
  }

  return {
    vshard,
    marked,
    writeRetries,
    occupationFailures,
    waitTimeouts,
    refusals,
    claimTakeovers,
    nativeClaims: claimed.nativeParts,
    ...(adoptedParts > 0 ? { adoptedParts } : {}),
    timings: { precheckMs: t1 - t0, writeMs: t2 - t1, occupyMs: t3 - t2 },
  };
}
