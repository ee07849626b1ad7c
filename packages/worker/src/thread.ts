/**
 * Piscina entry for a worker thread. It only dispatches: settings arrive once
 * as workerData, each task is one virtual-shard batch.
 */
import { workerData } from 'piscina';
import { pino } from 'pino';
import type { BatchResult, BatchTask, WorkerSettings } from '@tally/shared';
import { createRedisClient } from './redis-connection.js';
import { runAtomicBatch } from './atomic-batch.js';
import { runTwoStepBatch } from './two-step-batch.js';

const settings = workerData as WorkerSettings;
const log = pino({ level: settings.logLevel, base: { component: 'worker' } });
const redis = createRedisClient(settings.redisUrl, 'tally-worker');
// Connection errors surface through the batch steps' retries; this keeps
// ioredis from reporting each reconnect attempt as an unhandled 'error'.
redis.on('error', () => {});

// Chosen once per thread: the mode is fixed for the life of the daemon.
const runBatch = settings.mode === 'atomic' ? runAtomicBatch : runTwoStepBatch;

export default function processBatch(task: BatchTask): Promise<BatchResult> {
  return runBatch(redis, settings, task, log);
}
