/**
 * Everything that passes between the coordinator and a worker thread, in one
 * place. Three ways, each with one shape, every message tagged by `kind`:
 *
 * - **Requests and replies** (piscina's task and its result): a tagged union
 *   of requests, each with the one reply type it gets. The thread's entry
 *   (worker/src/thread.ts) dispatches on `kind`; the coordinator
 *   (worker-pools.ts) checks every reply's shape before it trusts it, and an
 *   answer of another shape is a bug (UnknownReplyError), never retried.
 * - **Events** (the thread's `parentPort.postMessage`, piscina's 'message'
 *   event on the pool): what a thread tells while a batch still runs, so a
 *   stall or a refusing Redis shows before the batch ends. Nothing is posted
 *   on the normal path.
 * - **The window gauge** (shared memory, window-gauge.ts, passed once in
 *   WorkerSettings): per shard, the messages inside a crash window right now.
 *   Memory, not a message, so a window open when the daemon is killed has
 *   been seen up to the meter's last sample. Slots, Int32 each, in
 *   ten-thousandths of a message: 0..V-1 each virtual shard's open window,
 *   V..2V-1 each shard's settling messages (markers sent, result not yet
 *   taken); a thread writes only the slots of the shards it owns.
 *
 * A batch's task is one transferred buffer (batch-protocol.ts WireBatchTask):
 * the main thread, which every delivery passes through, pays for a
 * structured clone per value it sends.
 */
import { isBatchReply, type BatchReply, type WireBatchTask } from './batch-protocol.js';
import type { RedisHealthEvent } from './redis-health.js';

/** What the coordinator asks a thread. */
export type ThreadRequest =
  /** Run one virtual-shard batch. */
  | { readonly kind: 'batch'; readonly task: WireBatchTask }
  /** Load the modules and connect to Redis before the first delivery (a Redis round trip). */
  | { readonly kind: 'warm' }
  /** Export the thread's buffered spans (before the threads stop). */
  | { readonly kind: 'flush-telemetry' };

export type ThreadRequestKind = ThreadRequest['kind'];

/** The one reply type of each request. */
export interface ThreadReplies {
  readonly batch: BatchReply;
  readonly warm: { readonly kind: 'warmed' };
  readonly 'flush-telemetry': { readonly kind: 'flushed' };
}

export type ThreadReply<K extends ThreadRequestKind = ThreadRequestKind> = ThreadReplies[K];

/** Whether a thread's answer to a request of `kind` has that request's reply shape. */
export function isThreadReply<K extends ThreadRequestKind>(kind: K, reply: unknown): reply is ThreadReply<K> {
  switch (kind) {
    case 'batch':
      return isBatchReply(reply);
    case 'warm':
      return (reply as { kind?: unknown } | null)?.kind === 'warmed';
    case 'flush-telemetry':
      return (reply as { kind?: unknown } | null)?.kind === 'flushed';
    default:
      return false;
  }
}

/**
 * What a thread posts while a batch runs: a WAIT that timed out (the stall
 * must show meanwhile), the Redis health of its batch steps
 * (redis-health.ts: a failed attempt, the first success after one), and a
 * refused message's counts on another shard that could not be undone
 * (cross-slot-counts.ts: an overcount, counted as it happens).
 */
export type ThreadEvent =
  | { readonly kind: 'wait-timeout'; readonly vshard: number; readonly acked: number; readonly wanted: number }
  | { readonly kind: 'redis-health'; readonly health: RedisHealthEvent }
  | { readonly kind: 'undo-failed'; readonly vshard: number; readonly parts: number };

/** Whether a posted value is a ThreadEvent: anything else on the port is ignored by the coordinator (piscina's own messages never reach it). */
export function isThreadEvent(value: unknown): value is ThreadEvent {
  const kind = (value as { kind?: unknown } | null)?.kind;
  return kind === 'wait-timeout' || kind === 'redis-health' || kind === 'undo-failed';
}
