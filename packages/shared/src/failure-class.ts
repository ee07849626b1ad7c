/**
 * What a failure means for the work that hit it, in the three classes of
 * invariant 11:
 *
 * - `transient`: the server or the path to it is unwell (connection lost,
 *   timeout, OOM, LOADING, failover). Waiting fixes it: retry with backoff.
 * - `fatal`: the server refuses Tally itself (no permission, wrong password,
 *   scripting off, a command it does not know) or Tally refuses to run (a
 *   TallyError). No retry fixes it: at start, stop with one line naming the
 *   fix; at run time, make it visible.
 * - `data`: the refusal is caused by the values being written (a count key
 *   that overflows or holds a foreign value, a wrong key type, a script
 *   argument it rejects). Retrying the same data fails the same way: isolate
 *   and dead-letter it.
 *
 * Pure and free of client libraries: both the daemon and its worker threads
 * classify with it, whichever client raised the error.
 */
import { isTallyError } from './errors.js';

export type FailureClass = 'transient' | 'fatal' | 'data';

/** Reply prefixes of a server in a passing state: loading, failing over, out of memory, resharding. */
const TRANSIENT_REPLY = /^(OOM|LOADING|BUSY|READONLY|MASTERDOWN|TRYAGAIN|CLUSTERDOWN|MOVED|ASK|NOSCRIPT|EXECABORT|MISCONF|NOREPLICAS)\b/;

/** Refusals caused by the values in the command: the same write fails the same way every time. */
const DATA_REPLY =
  /^(WRONGTYPE\b|ERR value is not an integer|ERR increment or decrement would overflow|ERR value is not a valid float|ERR increment would produce NaN or Infinity|TALLY_SCRIPT_ARGS\b)/;

/**
 * Classifies the text of a Redis error reply. Everything else is `fatal`:
 * the server's configuration refusing Tally (NOPERM, NOAUTH, WRONGPASS,
 * `ERR unknown command` for a renamed or disabled EVALSHA, scripting
 * disabled), and any reply neither list knows, because an unexplained
 * refusal should be seen, not retried quietly forever nor blamed on the data.
 */
export function classifyRedisReply(message: string): FailureClass {
  if (TRANSIENT_REPLY.test(message)) return 'transient';
  if (DATA_REPLY.test(message)) return 'data';
  return 'fatal';
}

/**
 * An error reply from Redis, told apart from a transport failure by its
 * name: ioredis raises `ReplyError` (from redis-errors) for every `-ERR`
 * line, and duck typing keeps this module free of the client library.
 */
export function isRedisReplyError(error: unknown): error is Error {
  return error instanceof Error && error.name === 'ReplyError';
}

/**
 * A failure classified where it happened and carried here as data: a worker
 * thread's batch failure (batch-protocol.ts BatchReply), whose original
 * error could not cross the thread boundary with its type.
 */
export class ClassifiedFailure extends Error {
  constructor(
    readonly failureClass: FailureClass,
    message: string,
  ) {
    super(message);
    this.name = 'ClassifiedFailure';
  }
}

/**
 * Classifies any failure of a Redis step or a worker batch:
 * a ClassifiedFailure keeps the class it carries,
 * a TallyError is `fatal` (Tally refused on purpose), a Redis error reply is
 * classified by its text, anything else (connection refused or closed,
 * command timeout, a worker thread that died) is `transient`.
 */
export function classifyError(error: unknown): FailureClass {
  if (error instanceof ClassifiedFailure) return error.failureClass;
  if (isTallyError(error)) return 'fatal';
  if (isRedisReplyError(error)) return classifyRedisReply(error.message);
  return 'transient';
}
