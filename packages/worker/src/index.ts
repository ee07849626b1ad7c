/**
 * @tally/worker: what runs in a worker thread; exports the thread entry's path for piscina.
 */
import { fileURLToPath } from 'node:url';

export { aggregateNewParts, type Sum } from './aggregate.js';
export type { BatchHooks, BatchLog } from './batch-log.js';
export { runTwoStepBatch } from './two-step-batch.js';

/** Absolute path of the compiled thread entry, for piscina's `filename`. */
export const WORKER_THREAD_FILE = fileURLToPath(new URL('./thread.js', import.meta.url));
