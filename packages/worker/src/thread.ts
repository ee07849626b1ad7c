/**
 * Piscina entry for a worker thread. It only dispatches: settings arrive once
 * as workerData, each request (thread-protocol.ts ThreadRequest) gets its
 * one reply type.
 */
import { context, propagation, ROOT_CONTEXT } from '@opentelemetry/api';
import { parentPort } from 'node:worker_threads';
import { workerData } from 'piscina';
import { pino } from 'pino';
import {
  classifyError,
  decodeBatchTask,
  describeError,
  loadFaultInjection,
  type BatchReply,
  type BatchResult,
  type BatchTask,
  type ThreadEvent,
  type ThreadReply,
  type ThreadRequest,
  type WireBatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { createRedisClient, REVIVING, REVIVING_MESSAGE, startTracing, traceIdsOfActiveSpan } from '@tally/runtime';
import { runAtomicBatch } from './atomic-batch.js';
import { runStreamBatch } from './stream-batch.js';
import { runTwoStepBatch } from './two-step-batch.js';
import type { BatchHooks } from './batch-log.js';

const settings = workerData as WorkerSettings;
// Each thread is its own isolate: it registers its own tracer provider.
const tracing = await startTracing(process.env);
const log = pino({ level: settings.logLevel, base: { component: 'worker' }, mixin: traceIdsOfActiveSpan });
// The topology was detected once by the daemon's probe: a cluster client follows the slots, a standalone one the URL.
const redis = createRedisClient(settings.redisUrl, 'tally-worker', {}, settings.redisTopology ?? 'standalone');
// Connection errors surface through the batch steps' retries; this keeps
// ioredis from reporting each reconnect attempt as an unhandled 'error'.
redis.on('error', () => {});
redis.on(REVIVING, (delayMs: number) => log.warn({ delayMs }, REVIVING_MESSAGE));

// Chosen once per thread: the source and the mode are fixed for the life of the daemon. A stream has no mode. A
// prefix of fenced adoption runs every batch as two-step does, in either mode: atomic's promise is kept by the
// adoption (fenced-adoption.ts), and daemons of both modes must take part in it.
const runInMode =
  settings.source === 'stream'
    ? runStreamBatch
    : settings.fencedAdoption === true
      ? runTwoStepBatch
      : settings.mode === 'atomic'
        ? runAtomicBatch
        : runTwoStepBatch;
const hooks = batchHooks();
const runBatch = (task: BatchTask): Promise<BatchResult> => runInMode(redis, settings, task, log, hooks);

/**
 * The thread's hooks into a batch: WAIT timeouts go to the coordinator as
 * they happen. And the fault suite's thread death (TALLY_FAULT_THREAD_EXIT_AFTER_WRITE, see
 * config.ts): process.exit() inside a worker thread ends this thread only;
 * piscina fails its tasks in flight with "worker exited" and starts a new
 * thread, and the coordinator reruns those batches under their own ids.
 */
function batchHooks(): BatchHooks {
  // Posted at once, not with the batch's result: a WAIT that keeps timing out may hold the batch for a long time.
  const onWaitTimeout = (task: BatchTask, acked: number, wanted: number): void => {
    const event: ThreadEvent = { kind: 'wait-timeout', vshard: task.vshard, acked, wanted };
    parentPort?.postMessage(event);
  };
  const onUndoFailed = (task: BatchTask, parts: number): void => {
    const event: ThreadEvent = { kind: 'undo-failed', vshard: task.vshard, parts };
    parentPort?.postMessage(event);
  };
  const { threadExitAfterWrite: exitAfter, killAfterWrite: killAfter } = loadFaultInjection(process.env);
  if (exitAfter === null && killAfter === null) return { onWaitTimeout, onUndoFailed };
  let writes = 0;
  return {
    onWaitTimeout,
    onUndoFailed,
    afterCountWrite(task) {
      writes++;
      if (killAfter !== null && writes >= killAfter) {
        // The whole daemon, as a SIGKILL from outside would: no close step runs, the markers stay unoccupied.
        log.warn({ vshard: task.vshard, batchId: task.batchId, writes }, 'fault injection: the daemon SIGKILLs itself after a count write');
        process.kill(process.pid, 'SIGKILL');
      }
      if (exitAfter === null || writes < exitAfter) return;
      log.warn({ vshard: task.vshard, batchId: task.batchId, writes }, 'fault injection: worker thread exits after a count write');
      process.exit(70);
    },
  };
}

/** TALLY_FAULT_BUG=thread (config.ts): every batch meets a real TypeError before it writes anything. */
const injectBug = loadFaultInjection(process.env).bug === 'thread';

/** The thread's one entry: piscina's default handler, dispatching on the request's kind. */
export default async function handle(request: ThreadRequest): Promise<ThreadReply> {
  switch (request.kind) {
    case 'batch':
      return processBatch(request.task);
    case 'warm':
      // Nothing but a Redis round trip: the coordinator sends it to every thread before it consumes, so the
      // thread has loaded its modules and connected by the time the first deliveries arrive, instead of a
      // restarted daemon holding a full prefetch window while its threads start.
      await redis.ping();
      return { kind: 'warmed' };
    case 'flush-telemetry':
      // Exports this thread's buffered spans; the coordinator asks before stopping the threads.
      await tracing?.flush();
      return { kind: 'flushed' };
    default:
      // A request this build does not know: the coordinator reads the missing reply as a bug (UnknownReplyError).
      throw new TypeError(`unknown thread request ${JSON.stringify((request as { kind?: unknown } | null)?.kind)}`);
  }
}

async function processBatch(wire: WireBatchTask): Promise<BatchReply> {
  try {
    // Inside the try: a task this thread cannot decode is a bug of the protocol, and is reported as one.
    const task = decodeBatchTask(wire);
    if (injectBug) injectedTypeError(task);
    if (task.traceparent === undefined) return { kind: 'batch-done', result: await runBatch(task) };
    // The coordinator's tally.batch span becomes the parent of this thread's spans.
    const parent = propagation.extract(ROOT_CONTEXT, { traceparent: task.traceparent });
    return { kind: 'batch-done', result: await context.with(parent, () => runBatch(task)) };
  } catch (error) {
    // Classified here, where the error still has its type (batch-protocol.ts BatchReply).
    const failureClass = classifyError(error);
    const stack = failureClass === 'bug' && error instanceof Error ? error.stack : undefined;
    return { kind: 'batch-failed', failureClass, message: describeError(error), ...(stack === undefined ? {} : { stack }) };
  }
}

/** What a slip in this file would do: read a property of something that is not there. */
function injectedTypeError(task: BatchTask): void {
  const missing = (task as unknown as { faultInjection?: { parts: number } }).faultInjection;
  log.debug({ parts: missing!.parts }, 'unreachable: the line above throws');
}
