/**
 * Invariant 13: a bug is not an outage. When Tally's own code fails (a
 * TypeError, a RangeError of the ack tracker, a broken assertion, a reply of
 * an unknown shape: failure class `bug`, failure-class.ts), waiting fixes
 * nothing and going on could ack a delivery whose state the broken code got
 * wrong. So the process logs the stack once, as one JSON line at level fatal,
 * and exits 70 (EX_SOFTWARE, sysexits.h) at once: nothing more is acked, and
 * the broker redelivers every unacked delivery to the next daemon (systemd
 * restarts this one: deploy/systemd/tally.service).
 *
 * Where a bug is met: the batch path and the delivery callback hand what
 * escapes them to the daemon's BugHandler (daemon.ts), whatever its class,
 * since both handle every server failure themselves (retried, dead-lettered)
 * and nothing is meant to escape them; the process-level handlers
 * (main.ts: uncaughtException, unhandledRejection, a failed start) call it
 * for errors classified `bug`.
 */
import { classifyError, describeError } from '@tally/shared';
import type { Logger } from './logger.js';

/** The exit code of a bug (sysexits.h EX_SOFTWARE, "internal software error"). */
export const EX_SOFTWARE = 70;

/** Where the bug surfaced, for the log line. */
export type BugSite = 'batch' | 'delivery' | 'start' | 'uncaught exception' | 'unhandled rejection';

export type BugHandler = (error: unknown, where: BugSite) => void;

/** The fields of the one fatal line: the message, the error's type and class, and its stack (a worker thread's own, when it came from one). */
export function bugLogFields(error: unknown, where: BugSite): Record<string, unknown> {
  const stack = error instanceof Error ? (error.stack ?? `${error.name}: ${error.message}`) : String(error);
  return {
    where,
    failureClass: 'bug',
    classified: classifyError(error),
    errorType: error instanceof Error ? error.name : typeof error,
    err: describeError(error),
    stack,
    exitCode: EX_SOFTWARE,
  };
}

/**
 * The handler main.ts gives the daemon and the process: logs once and
 * exits. A second bug met before the exit (another batch failing in the
 * same turn) is not logged again. `exit` is process.exit, synchronous: no
 * ack, timer or callback of this process runs after it.
 */
export function exitOnBug(log: Logger, exit: (code: number) => never = process.exit): BugHandler {
  let met = false;
  return (error, where) => {
    if (!met) {
      met = true;
      log.fatal(bugLogFields(error, where), `bug in Tally (${where}): exiting ${EX_SOFTWARE} without acking anything more; unacked deliveries are redelivered`);
    }
    exit(EX_SOFTWARE);
  };
}
