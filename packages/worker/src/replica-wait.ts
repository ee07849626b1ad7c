/**
 * TALLY_REDIS_WAIT_REPLICAS: a batch is reported done (and its deliveries
 * acked) only once that many replicas have its writes, so a master that dies
 * right after the ack, and is replaced by its replica, loses nothing acked.
 *
 * Redis WAIT counts the replicas that have every write made *on the
 * connection it is sent on*. So it is sent on the connection that wrote the
 * batch: the master of the batch's slot on a cluster (one slot per virtual
 * shard), the one connection on a standalone Redis. When that connection is
 * no longer the one serving the slot (its master died, the slot moved, a
 * standalone client reconnected), the writes are made again on the current
 * one before WAIT. Both scripts are safe to repeat: the count write carries
 * the batch's receipt (a repeat on a node that has it writes nothing, and a
 * node without it lost the counts too), and occupying a marker twice is a
 * no-op. A WAIT that times out short of the replicas is sent again; nothing
 * is acked meanwhile.
 */
import type { Redis } from 'ioredis';
import { describeError, retryUntilDone, type BatchTask } from '@tally/shared';
import { markConnection, onSlotConnection, sameConnection, type ConnectionMark, type RedisClient } from '@tally/runtime';
import type { BatchLog } from './batch-log.js';

export interface ReplicaWait {
  readonly replicas: number;
  readonly timeoutMs: number;
}

/** WAIT answered with fewer replicas than asked, within its timeout: transient, sent again. */
export class ReplicasBehindError extends Error {
  constructor(acked: number, wanted: number, timeoutMs: number) {
    super(`WAIT: ${acked} of ${wanted} replica(s) acknowledged the batch's writes within ${timeoutMs} ms`);
    this.name = 'ReplicasBehindError';
  }
}

/**
 * Waits until `wait.replicas` replicas have the batch's writes. `written` is
 * the connection the writes went out on (null when they were spread over
 * connections); `rewrite` makes them again on another one.
 */
export async function confirmReplicated(
  redis: RedisClient,
  shardKey: string,
  wait: ReplicaWait,
  written: ConnectionMark | null,
  rewrite: (connection: Redis) => Promise<void>,
  task: BatchTask,
  log: BatchLog,
): Promise<void> {
  let mark = written;
  await retryUntilDone(
    () =>
      onSlotConnection(redis, shardKey, async (connection) => {
        if (!sameConnection(mark, connection)) {
          mark = null;
          const next = markConnection(connection);
          await rewrite(connection);
          mark = next;
        }
        const acked = Number(await connection.wait(wait.replicas, wait.timeoutMs));
        if (acked < wait.replicas) throw new ReplicasBehindError(acked, wait.replicas, wait.timeoutMs);
      }),
    {
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
        log.warn({ step: 'wait_replicas', vshard: task.vshard, attempt, delayMs, failureClass, err: describeError(error) }, 'redis step failed; retrying'),
    },
  );
}

/** The WAIT settings of a thread, or null when TALLY_REDIS_WAIT_REPLICAS is 0. */
export function replicaWaitOf(settings: { redisWaitReplicas?: number; redisWaitTimeoutMs?: number }): ReplicaWait | null {
  const replicas = settings.redisWaitReplicas ?? 0;
  return replicas > 0 ? { replicas, timeoutMs: settings.redisWaitTimeoutMs ?? 5_000 } : null;
}
