import { fileURLToPath } from 'node:url';

export { aggregateNewParts, selectNewParts, type Sum } from './aggregate.js';
export { createRedisClient } from './redis-connection.js';
export { runTwoStepBatch, type BatchHooks, type BatchLog } from './two-step-batch.js';
export { startTracing, traceIdsOfActiveSpan, tracingRequested, type TracingHandle } from './tracing.js';

/** Absolute path of the compiled thread entry, for piscina's `filename`. */
export const WORKER_THREAD_FILE = fileURLToPath(new URL('./thread.js', import.meta.url));
