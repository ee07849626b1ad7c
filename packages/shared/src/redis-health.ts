/**
 * Redis health as the worker threads see it, told to the coordinator.
 *
 * Nearly every write Tally makes runs inside a worker thread, and a batch
 * step that Redis refuses (OOM under noeviction, READONLY after a failover,
 * MASTERDOWN, LOADING, or no answer at all) is retried there, quietly from
 * the coordinator's point of view: the batch simply takes longer. So each
 * thread posts an event to the coordinator (a ThreadEvent on its piscina
 * port, thread-protocol.ts) when a step fails and when a step of the same
 * shard succeeds again. Why this way:
 *
 * - reliable: it reports the very writes that are refused, not a probe that
 *   might pass while the scripts fail (or the reverse);
 * - fast: the first failed attempt is on the coordinator's event loop within
 *   milliseconds, well inside /readyz's one-second target;
 * - cheap: nothing is sent on the normal path. Events are posted only on a
 *   failed attempt (spaced by the retry backoff) and on the first success
 *   after one.
 *
 * A Redis ReplyError that crossed a thread boundary would arrive as a plain
 * Error without its name, so the thread classifies the failure itself and
 * sends the class and the reply's first word explicitly.
 */
import { classifyError, isRedisReplyError, type FailureClass } from './failure-class.js';

export type RedisHealthEvent =
  | {
      readonly kind: 'refused';
      /** Where the refusal was seen: `shard <n>` for a worker's batch step, a name for the coordinator's own calls. */
      readonly source: string;
      /** The reply's first word (`OOM`, `READONLY`, `MASTERDOWN`, `LOADING`, `NOPERM`, …) or `unavailable` for no reply at all. */
      readonly errorType: string;
      readonly failureClass: FailureClass;
      readonly message: string;
    }
  | { readonly kind: 'recovered'; readonly source: string };

/**
 * ioredis's words for a call that got no reply, and an operator's. Its own
 * text names a client option ("Reached the max retries per request limit
 * (which is 0). Refer to "maxRetriesPerRequest" option for details.") that
 * is Tally's choice (the batch retries, not the client), so at 3 a.m. on
 * /readyz it reads as a setting to change during what is a failover or an
 * outage.
 */
const NO_REPLY: ReadonlyArray<readonly [RegExp, string]> = [
  [/max retries per request/i, 'no reply from Redis (not connected, or the connection dropped)'],
  [/^Connection is closed/i, 'no reply from Redis (the connection is closed)'],
  [/Stream isn't writeable/i, 'no reply from Redis (not connected)'],
];

/** What a failed Redis call says about the server, in a form that survives postMessage. */
export function describeRefusal(error: unknown): { errorType: string; failureClass: FailureClass; message: string } {
  const failureClass = classifyError(error);
  const message = error instanceof Error ? error.message : String(error);
  if (isRedisReplyError(error)) return { errorType: /^[A-Z][A-Z_]*/.exec(message)?.[0] ?? 'ERR', failureClass, message };
  const noReply = NO_REPLY.find(([pattern]) => pattern.test(message));
  if (noReply === undefined) return { errorType: 'unavailable', failureClass, message };
  // The error's class when ioredis gave it one (its message is the misleading part), else its own short text.
  const said = error instanceof Error && error.name !== 'Error' ? error.name : JSON.stringify(message);
  return { errorType: 'unavailable', failureClass, message: `${noReply[1]}; ioredis: ${said}` };
}

/** Whether a failure is the server's state (worth /readyz and the gauge) rather than the data's, which is dead-lettered. */
export function isServerRefusal(failureClass: FailureClass): boolean {
  // Neither the data's (dead-lettered) nor Tally's own bug (the process stops).
  return failureClass === 'transient' || failureClass === 'fatal';
}
