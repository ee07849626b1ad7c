/**
 * What a batch in a worker thread logs to, and its fault hooks, for both modes.
 */
import type { BatchTask } from '@tally/shared';

/** What a batch logs to: the thread's pino logger, or a quiet one in tests. */
export interface BatchLog {
  warn(fields: Record<string, unknown>, message: string): void;
  error(fields: Record<string, unknown>, message: string): void;
}

/**
 * Fault hooks (tests and TALLY_FAULT_THREAD_EXIT_AFTER_WRITE).
 * `afterCountWrite` runs right after a count write that wrote something: in
 * two-step mode between the count write and the marker occupation (inside
 * the crash window), in atomic mode between the script and the reply. A write
 * answered by its receipt (a rerun) does not call it.
 */
export interface BatchHooks {
  afterCountWrite?: (task: BatchTask) => void | Promise<void>;
  /** Two-step mode: runs after the claim and before the count write (tests: a batch that stalls there). */
  beforeCountWrite?: (task: BatchTask) => void | Promise<void>;
  /** A WAIT timed out (TALLY_REDIS_WAIT_REPLICAS): the thread tells the coordinator at once, the batch waits on. */
  onWaitTimeout?: (task: BatchTask, acked: number, wanted: number) => void;
  /** Refused messages' counts on another count shard could not be undone (cross-slot-counts.ts): `parts` refused parts have counts standing. */
  onUndoFailed?: (task: BatchTask, parts: number) => void;
}
