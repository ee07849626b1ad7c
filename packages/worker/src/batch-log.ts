import type { BatchTask } from '@tally/shared';

/** What a batch logs to: the thread's pino logger, or a quiet one in tests. */
export interface BatchLog {
  warn(fields: Record<string, unknown>, message: string): void;
  error(fields: Record<string, unknown>, message: string): void;
}

/** Test hook: called between the count write and the marker occupation (two-step mode). */
export interface BatchHooks {
  afterCountWrite?: (task: BatchTask) => void | Promise<void>;
}
