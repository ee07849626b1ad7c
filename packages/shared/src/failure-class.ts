/**
 * What a failure means for the work that hit it: the three classes of
 * invariant 11, and Tally's own bugs (invariant 13):
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
 * - `bug`: Tally's own code is wrong (TypeError, RangeError, ReferenceError,
 *   SyntaxError, a broken node:assert assertion, a reply of a shape the code
 *   does not know: UnknownReplyError). Nothing about the servers changes by
 *   waiting, and going on could ack what was not written: never retried
 *   (retry.ts); the daemon logs the stack once and exits 70, acking nothing
 *   more. As kafkajs's retry never retries these.
 *
 * Pure and free of client libraries: both the daemon and its worker threads
 * classify with it, whichever client raised the error.
 */
import { isTallyError, UnknownReplyError } from './errors.js';

export type FailureClass = 'transient' | 'fatal' | 'data' | 'bug';

/**
 * The built-in error types only a programming error raises. The client
 * libraries raise plain Errors (or their own subclasses of Error) for
 * connections, timeouts and replies, so these never stand for an outage.
 */
const PROGRAMMING_ERRORS: ReadonlyArray<new (...args: never[]) => Error> = [TypeError, RangeError, ReferenceError, SyntaxError];

/**
 * A failure of Tally's own code. By type for the built-ins, by name or code
 * for node:assert's AssertionError (and any other library's assertion of the
 * same name), by class for UnknownReplyError. An error cloned across a thread
 * boundary (piscina passes a thread's uncaught error to the task) keeps the
 * built-in type, so a thread's TypeError is still a bug here.
 */
export function isProgrammingError(error: unknown): error is Error {
  if (!(error instanceof Error)) return false;
  if (PROGRAMMING_ERRORS.some((type) => error instanceof type)) return true;
  if (error instanceof UnknownReplyError) return true;
  return error.name === 'AssertionError' || (error as { code?: unknown }).code === 'ERR_ASSERTION';
}

/** Reply prefixes of a server in a passing state: loading, failing over, out of memory, resharding. */
const TRANSIENT_REPLY = /^(OOM|LOADING|BUSY|READONLY|MASTERDOWN|TRYAGAIN|CLUSTERDOWN|MOVED|ASK|NOSCRIPT|EXECABORT|MISCONF|NOREPLICAS)\b/;
/**
 * WAIT sent to a replica: a connection that reached a node while it was
 * being demoted, or a replica answering before the Sentinels' switch. The
 * client's ready check and READONLY move it to the primary; the batch waits.
 */
const REPLICA_REPLY = /^ERR WAIT cannot be used with replica instances/;

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
  if (TRANSIENT_REPLY.test(message) || REPLICA_REPLY.test(message)) return 'transient';
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
 * error could not cross the thread boundary with its type. `stack`, when
 * given, is the original error's (the thread's): a bug is logged with the
 * stack of where it happened, not of where the reply arrived.
 */
export class ClassifiedFailure extends Error {
  constructor(
    readonly failureClass: FailureClass,
    message: string,
    stack?: string,
  ) {
    super(message);
    this.name = 'ClassifiedFailure';
    if (stack !== undefined) this.stack = stack;
  }
}

/**
 * Classifies any failure of a Redis step or a worker batch:
 * a ClassifiedFailure keeps the class it carries, a programming error is a
 * `bug` (isProgrammingError), any other TallyError is `fatal` (Tally refused
 * on purpose), a Redis error reply is classified by its text, anything else
 * (connection refused or closed, command timeout, a worker thread that died:
 * plain Errors and the client libraries' own classes) is `transient`.
 */
export function classifyError(error: unknown): FailureClass {
  if (error instanceof ClassifiedFailure) return error.failureClass;
  if (isProgrammingError(error)) return 'bug';
  if (isTallyError(error)) return 'fatal';
  if (isRedisReplyError(error)) return classifyRedisReply(error.message);
  return 'transient';
}
