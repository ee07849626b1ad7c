/**
 * Piscina entry for a worker thread. It only dispatches: settings arrive once
 * as workerData, each task is one virtual-shard batch.
 */
import { context, propagation, ROOT_CONTEXT } from '@opentelemetry/api';
import { workerData } from 'piscina';
import { pino } from 'pino';
import { decodeBatchTask, type BatchResult, type WireBatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient, startTracing, traceIdsOfActiveSpan } from '@tally/runtime';
import { runAtomicBatch } from './atomic-batch.js';
import { runTwoStepBatch } from './two-step-batch.js';

const settings = workerData as WorkerSettings;
// Each thread is its own isolate: it registers its own tracer provider.
const tracing = await startTracing(process.env);
const log = pino({ level: settings.logLevel, base: { component: 'worker' }, mixin: traceIdsOfActiveSpan });
// The topology was detected once by the daemon's probe: a cluster client follows the slots, a standalone one the URL.
const redis = createRedisClient(settings.redisUrl, 'tally-worker', {}, settings.redisTopology ?? 'standalone');
// Connection errors surface through the batch steps' retries; this keeps
// ioredis from reporting each reconnect attempt as an unhandled 'error'.
redis.on('error', () => {});

// Chosen once per thread: the mode is fixed for the life of the daemon.
const runBatch = settings.mode === 'atomic' ? runAtomicBatch : runTwoStepBatch;

export default function processBatch(wire: WireBatchTask): Promise<BatchResult> {
  const task = decodeBatchTask(wire);
  if (task.traceparent === undefined) return runBatch(redis, settings, task, log);
  // The coordinator's tally.batch span becomes the parent of this thread's spans.
  const parent = propagation.extract(ROOT_CONTEXT, { traceparent: task.traceparent });
  return context.with(parent, () => runBatch(redis, settings, task, log));
}

/** Exports this thread's buffered spans; the coordinator calls it before stopping the threads. */
export async function flushTelemetry(): Promise<void> {
  await tracing?.flush();
}
