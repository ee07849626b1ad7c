/**
 * Durability of an ack: with TALLY_REDIS_WAIT_REPLICAS=N > 0
 * a batch returns, and so its deliveries can be acked, only once N replicas
 * acknowledged its counts and markers (Redis WAIT).
 *
 * WAIT counts the replicas that acknowledged every write this *connection*
 * made. A connection that was replaced between the batch's writes and the
 * WAIT (ioredis reconnects on its own) has made no write, and its WAIT would
 * answer at once, acknowledging nothing of ours. So every attempt sends, on
 * one connection and in one pipeline, a write of its own and then the WAIT:
 * confirm_markers.lua, which checks that every marker the batch relies on
 * is done and then writes to the shard's newest marker bucket (a key in the
 * batch's hash slot), then WAIT. The replication stream of a master is one
 * ordered stream: a replica that acknowledged that write has every earlier
 * write too, the
 * batch's counts, receipt and markers included, and the markers of the
 * duplicates it found (they were set before it read them).
 *
 * Every marker, not only the one touched: after a failover the WAIT is
 * answered by the promoted replica's replicas, and one marker being there
 * says nothing of a marker another batch set on the old master (a duplicate
 * this batch found before it was replicated). An ack on the strength of the
 * touched bucket alone would lose the parts of the missing one.
 *
 * - Markers missing: they are gone, and so are the writes before them (a
 *   failover to a replica that never had them). The batch fails (transient)
 *   and the coordinator reruns it under the same id: the counts are written
 *   again if their receipt went with them, not otherwise.
 * - Redis refuses the pair (NOPERM for WAIT, a connection lost): retried
 *   with backoff, logged and reported to readiness, as every batch step is;
 *   only a refusal for the data gives up.
 * - WAIT answers fewer than N: a timeout. It is counted, logged and posted to
 *   the coordinator at once, and the pair is sent again; nothing is acked
 *   meanwhile, however long it takes.
 *
 * On Redis Cluster the pipeline goes to the master of the batch's slot
 * (onSlotConnection), whose replicas are the ones that matter; a NOSCRIPT
 * reply loads the script there and the pair is sent again.
 */
import type { Redis } from 'ioredis';
import { onSlotConnection, type RedisClient } from '@tally/runtime';
import {
  describeError,
  markerBaseKey,
  markerFilterBits,
  RETRY_STOPPED,
  retryUntilDone,
  watermarkKey,
  type BatchTask,
  type WorkerSettings,
} from '@tally/shared';
import type { BatchLog } from './batch-log.js';
import { reportingHealth } from './health-report.js';
import { evalshaArgs, isNoScript, loadScript, loadScriptInto, type LuaScript } from './lua-scripts.js';

/** The existence check and touch before each WAIT, its KEYS and ARGV documented in lua/confirm_markers.lua. */
export const CONFIRM_MARKERS = loadScript('confirm_markers');
/** Its stream-mode counterpart, lua/confirm_watermarks.lua. */
export const CONFIRM_WATERMARKS = loadScript('confirm_watermarks');

/** Called on each WAIT that timed out: how many replicas acknowledged, of how many wanted. */
export type OnWaitTimeout = (task: BatchTask, acked: number, wanted: number) => void;

export class BatchWritesLostError extends Error {
  constructor(what: string) {
    super(`${what} gone before the replicas acknowledged the batch (a failover lost writes it relies on); rerunning the batch`);
    this.name = 'BatchWritesLostError';
  }
}

/**
 * Returns once `waitReplicas` replicas acknowledged every write up to a fresh
 * touch of the shard's markers, after checking that the markers of
 * `digests` (the parts the batch relies on) are all done: see above.
 * Resolves to the number of WAITs that timed out.
 */
export async function waitForReplicas(
  redis: RedisClient,
  settings: Pick<
    WorkerSettings,
    'prefix' | 'waitReplicas' | 'waitTimeoutMs' | 'markerTtlS' | 'markerBucketS' | 'markerSubBuckets' | 'markerScope' | 'markerFilterBits'
  >,
  task: BatchTask,
  digests: readonly Uint8Array[],
  log: BatchLog,
  onTimeout: OnWaitTimeout = () => {},
): Promise<number> {
  const shardKey = markerBaseKey(settings.prefix, task.vshard);
  // Distinct digests (a message twice in one batch relies on one marker), byte for byte.
  const distinct = [...new Map(digests.map((digest) => [Buffer.from(digest).toString('latin1'), Buffer.from(digest)])).values()];
  const confirm: Confirmation = {
    script: CONFIRM_MARKERS,
    args: evalshaArgs(
      CONFIRM_MARKERS,
      [shardKey],
      [settings.markerBucketS, settings.markerTtlS, settings.markerSubBuckets, markerFilterBits(settings.markerScope, settings.markerFilterBits), ...distinct],
    ),
    slotKey: shardKey,
    lost: (missing) => `${missing} of the batch's ${distinct.length} markers are`,
  };
  return waitAfterConfirming(redis, settings, task, confirm, log, onTimeout);
}

/**
 * Stream mode: the same, after checking that the shard's watermarks still
 * reach the offsets the batch applied or found applied (`reached`, by
 * partition): the watermarks are what a stream batch relies on.
 */
export async function waitForStreamReplicas(
  redis: RedisClient,
  settings: Pick<WorkerSettings, 'prefix' | 'waitReplicas' | 'waitTimeoutMs'>,
  task: BatchTask,
  reached: ReadonlyMap<number, number>,
  log: BatchLog,
  onTimeout: OnWaitTimeout = () => {},
): Promise<number> {
  const watermarks = watermarkKey(settings.prefix, task.vshard);
  const pairs: string[] = [];
  for (const [partition, offset] of reached) pairs.push(String(partition), String(offset));
  const confirm: Confirmation = {
    script: CONFIRM_WATERMARKS,
    args: evalshaArgs(CONFIRM_WATERMARKS, [watermarks, `${watermarks}:touch`], pairs),
    slotKey: watermarks,
    lost: (missing) => `the watermarks of ${missing} of the batch's ${reached.size} partitions are`,
  };
  return waitAfterConfirming(redis, settings, task, confirm, log, onTimeout);
}

/** What a WAIT follows: a script that checks what the batch relies on and writes a touch in its slot. */
interface Confirmation {
  readonly script: LuaScript;
  readonly args: ReturnType<typeof evalshaArgs>;
  readonly slotKey: string;
  /** How the error names what went missing. */
  lost(missing: number): string;
}

async function waitAfterConfirming(
  redis: RedisClient,
  settings: Pick<WorkerSettings, 'waitReplicas' | 'waitTimeoutMs'>,
  task: BatchTask,
  confirm: Confirmation,
  log: BatchLog,
  onTimeout: OnWaitTimeout,
): Promise<number> {
  return waitAfterTouch(
    redis,
    settings,
    task,
    {
      slotKey: confirm.slotKey,
      touch: async (connection) => {
        const send = () => connection.pipeline().call('EVALSHA', confirm.args).call('WAIT', settings.waitReplicas, settings.waitTimeoutMs).exec();
        let replies = await send();
        if (replies !== null && isNoScript(replies[0]![0])) {
          // A fresh or restarted server: load the script there and send the pair again (that WAIT's answer was not ours).
          await loadScriptInto(connection, confirm.script);
          replies = await send();
        }
        return replies;
      },
      onMissing: (missing) => {
        throw new BatchWritesLostError(confirm.lost(missing));
      },
    },
    log,
    onTimeout,
  );
}

/**
 * A write of the batch's own in a slot, then WAIT, on one connection and in
 * one pipeline (see above): `touch` sends the pair and answers with its
 * replies, the first a count of what it found missing (0: nothing).
 * `onMissing` throws, or repairs what is missing and the pair is sent again.
 */
export interface Touch {
  readonly slotKey: string;
  touch(connection: Redis): Promise<Array<[Error | null, unknown]> | null>;
  onMissing(missing: number): Promise<void> | void;
  /**
   * Aborted when the batch failed elsewhere (a sibling WAIT of the same batch): the loop stops after the pair in
   * flight, with the signal's reason, instead of waiting on for a batch its rerun waits for again.
   */
  readonly until?: AbortSignal;
}

/** Sends `touch` until its WAIT answers enough replicas; resolves to the WAITs that timed out. */
export async function waitAfterTouch(
  redis: RedisClient,
  settings: Pick<WorkerSettings, 'waitReplicas' | 'waitTimeoutMs'>,
  task: BatchTask,
  touch: Touch,
  log: BatchLog,
  onTimeout: OnWaitTimeout,
): Promise<number> {
  const wanted = settings.waitReplicas;
  let timeouts = 0;
  for (;;) {
    touch.until?.throwIfAborted();
    const reply = await retryUntilDone(
      reportingHealth(task.vshard, () =>
        onSlotConnection(redis, touch.slotKey, async (connection) => {
          const replies = await touch.touch(connection);
          if (replies === null) throw new Error('WAIT pipeline discarded');
          for (const [error] of replies) if (error) throw error;
          return [Number(replies[0]![1]), Number(replies[1]![1])] as const;
        }),
      ),
      {
        // As every other batch step (two-step-batch.ts untilDone): a refusal of Tally itself (NOPERM on WAIT) is
        // retried here, visibly in the log and /readyz, not handed up as a failed batch the coordinator reruns whole.
        // Only data gives up: what the touch writes fails the same way on every attempt.
        giveUp: (failureClass) => failureClass === 'data',
        stopWhen: () => touch.until?.aborted === true,
        onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
          log.warn({ step: 'wait', vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying'),
      },
    );
    if (reply === RETRY_STOPPED) touch.until!.throwIfAborted();
    const [missing, acked] = reply as readonly [number, number];
    if (missing > 0) {
      await touch.onMissing(missing);
      continue;
    }
    if (acked >= wanted) return timeouts;
    timeouts++;
    onTimeout(task, acked, wanted);
    log.warn(
      { step: 'wait', vshard: task.vshard, batchId: task.batchId, acked, wanted, timeoutMs: settings.waitTimeoutMs, timeouts },
      'replicas did not acknowledge the batch in time (WAIT); waiting again, its deliveries stay unacked',
    );
  }
}
