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
 * PEXPIRE on one of the batch's markers (a key the batch's writes left, in
 * the batch's hash slot), then WAIT. The replication stream of a master is
 * one ordered stream: a replica that acknowledged the PEXPIRE has every
 * earlier write too, the batch's counts, receipt and markers included.
 *
 * - PEXPIRE answers 0: the marker is gone, and so are the writes before it
 *   (a failover to a replica that never had them). The batch fails
 *   (transient) and the coordinator reruns it under the same id: the counts
 *   are written again if their receipt went with them, not otherwise.
 * - WAIT answers fewer than N: a timeout. It is counted, logged and posted to
 *   the coordinator at once, and the pair is sent again; nothing is acked
 *   meanwhile, however long it takes.
 *
 * On Redis Cluster the pipeline goes where its key lives (ioredis routes a
 * cluster pipeline by its first key): the master of the batch's slot, whose
 * replicas are the ones that matter.
 */
import type { RedisClient } from '@tally/runtime';
import { describeError, retryUntilDone, type BatchTask, type WorkerSettings } from '@tally/shared';
import type { BatchLog } from './batch-log.js';

/** Called on each WAIT that timed out: how many replicas acknowledged, of how many wanted. */
export type OnWaitTimeout = (task: BatchTask, acked: number, wanted: number) => void;

export class BatchWritesLostError extends Error {
  constructor(key: string) {
    super(`the batch's marker ${key} is gone before the replicas acknowledged it (a failover lost the batch's writes); rerunning the batch`);
    this.name = 'BatchWritesLostError';
  }
}

/**
 * Returns once `waitReplicas` replicas acknowledged every write up to a fresh
 * PEXPIRE of `touchKey` (or PEXPIREAT `expireAtMs`, for a key whose expiry
 * must not move: a marker bucket's meta hash); resolves to the number of
 * WAITs that timed out.
 */
export async function waitForReplicas(
  redis: RedisClient,
  settings: Pick<WorkerSettings, 'waitReplicas' | 'waitTimeoutMs' | 'markerTtlS'>,
  task: BatchTask,
  touchKey: string,
  log: BatchLog,
  onTimeout: OnWaitTimeout = () => {},
  expireAtMs?: number,
): Promise<number> {
  const wanted = settings.waitReplicas;
  let timeouts = 0;
  for (;;) {
    const [touched, acked] = await retryUntilDone(
      async () => {
        const pipeline = redis.pipeline();
        if (expireAtMs === undefined) pipeline.pexpire(touchKey, settings.markerTtlS * 1000);
        else pipeline.pexpireat(touchKey, expireAtMs);
        const replies = await pipeline.call('WAIT', wanted, settings.waitTimeoutMs).exec();
        if (replies === null) throw new Error('WAIT pipeline discarded');
        for (const [error] of replies) if (error) throw error;
        return [Number(replies[0]![1]), Number(replies[1]![1])] as const;
      },
      {
        giveUp: (failureClass) => failureClass !== 'transient',
        onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
          log.warn({ step: 'wait', vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying'),
      },
    );
    if (touched === 0) throw new BatchWritesLostError(touchKey);
    if (acked >= wanted) return timeouts;
    timeouts++;
    onTimeout(task, acked, wanted);
    log.warn(
      { step: 'wait', vshard: task.vshard, batchId: task.batchId, acked, wanted, timeoutMs: settings.waitTimeoutMs, timeouts },
      'replicas did not acknowledge the batch in time (WAIT); waiting again, its deliveries stay unacked',
    );
  }
}
