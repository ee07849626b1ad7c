/**
 * Runs one shard batch to its result: the batch's id and span, the task sent
 * to the owner thread, the retries and the isolation of data failures. What
 * the result means for each delivery is settlement.ts's job.
 */
import { randomUUID } from 'node:crypto';
import type { Tracer } from '@opentelemetry/api';
import {
  describeError,
  encodeBatchTask,
  encodePositions,
  retryUntilDone,
  RETRY_STOPPED,
  type BackoffOptions,
  type BatchResult,
  type TallyMode,
  type WireParts,
} from '@tally/shared';
import { runIsolating } from './batch-isolation.js';
import type { Logger } from '../process/logger.js';
import type { PendingPart } from './shard-lanes.js';
import { failBatchSpan, startBatchSpan } from '../telemetry/batch-span.js';
import type { BatchObserver } from './batch-observer.js';
import type { BatchRunner, Clock, StreamLog } from './ports.js';

export interface ShardBatchOptions {
  readonly queue: string;
  readonly mode: TallyMode;
  /** The retries' backoff; the shared default when absent (tests shorten it). */
  readonly backoff?: BackoffOptions;
}

export interface ShardBatchDeps {
  readonly runner: BatchRunner;
  /** Told once per batch, of its result or that it was given up (batch-observer.ts). */
  readonly observer: BatchObserver;
  readonly clock: Clock;
  readonly tracer: Tracer;
  readonly log: Logger;
  /** Stream source: the watermarks each batch expects; null for a queue. */
  readonly streamLog: StreamLog | null;
}

export class ShardBatches {
  private readonly runner: BatchRunner;
  private readonly observer: BatchObserver;
  private readonly clock: Clock;
  private readonly tracer: Tracer;
  private readonly log: Logger;
  private readonly streamLog: StreamLog | null;

  constructor(
    private readonly options: ShardBatchOptions,
    deps: ShardBatchDeps,
  ) {
    ({ runner: this.runner, observer: this.observer, clock: this.clock, tracer: this.tracer, log: this.log, streamLog: this.streamLog } = deps);
  }

  /**
   * Runs the batch on its owner thread until it completes; null when it was
   * given up because the threads stopped (its deliveries stay unacked and go
   * back to the broker).
   */
  async run(vshard: number, parts: readonly PendingPart[]): Promise<BatchResult | null> {
    const { options, runner, log } = this;
    const { span, traceparent } = startBatchSpan(this.tracer, {
      vshard,
      queue: options.queue,
      mode: options.mode,
      parts: parts.length,
      traceparents: () => parts.map((part) => part.delivery.traceparent as string | undefined),
      distinctSkus: () => new Set(parts.flatMap((part) => part.changes.map(([sku]) => sku))).size,
    });
    // Made here, once, not in the thread: every rerun below (a dead thread, a
    // lost reply) carries the same id and finds the write receipt of an earlier
    // run, so the counts are never written twice (invariant 12).
    const batchId = randomUUID();
    const started = this.clock.now();
    // A thread that died mid-batch is replaced by piscina. Re-running the
    // batch is safe: its receipt (same batch id) answers a count write that
    // already landed, so only the markers are occupied again. A `transient`
    // or `fatal` failure is retried, visibly; a `data` failure would fail the
    // same way forever, so it is isolated instead (batch-isolation.ts).
    const runRange = async (id: string, from: number, to: number): Promise<BatchResult> => {
      // Encoded per attempt: the buffer is moved to the thread (worker-pools.ts), so a retry needs its own.
      const wireParts: WireParts = {
        count: to - from,
        digest: (i) => parts[from + i]!.delivery.digest,
        changes: (i) => parts[from + i]!.changes,
        // Each part's share of its message is 1/this, for the threads' window gauge.
        messageParts: (i) => parts[from + i]!.delivery.parts,
      };
      const outcome = await retryUntilDone(() => runner.run(encodeBatchTask(vshard, id, wireParts, traceparent, this.positionsOf(vshard, parts, from, to))), {
        // Stopping: the threads were terminated; the deliveries stay unacked and go back to the broker.
        stopWhen: () => runner.stopped,
        giveUp: (failureClass) => failureClass === 'data',
        onAttemptFailed: ({ error, attempt, delayMs, failureClass }) => {
          failBatchSpan(span, error);
          log.error(
            { vshard, batchId: id, attempt, delayMs, failureClass, err: describeError(error), trace_id: traceparent?.slice(3, 35) },
            'batch failed in its worker thread; retrying',
          );
        },
        ...(options.backoff === undefined ? {} : { backoff: options.backoff }),
      });
      if (outcome === RETRY_STOPPED) throw new BatchAbandoned();
      return outcome;
    };
    let result: BatchResult;
    try {
      result = await runIsolating(vshard, parts.length, batchId, runRange, (error, id, from, to) => {
        failBatchSpan(span, error);
        log.error(
          { vshard, batchId: id, parts: to - from, failureClass: 'data', err: describeError(error), trace_id: traceparent?.slice(3, 35) },
          to - from === 1
            ? 'redis refused a part for its data: its message goes to the dead-letter queue (count-refused)'
            : 'batch refused for its data; isolating its parts',
        );
      });
    } catch (error) {
      this.observer.batchSettled({ vshard, parts, result: null, elapsedMs: this.clock.now() - started, span });
      if (!(error instanceof BatchAbandoned)) throw error;
      return null;
    }
    this.observer.batchSettled({ vshard, parts, result, elapsedMs: this.clock.now() - started, span });
    return result;
  }

  /**
   * Stream source: each part's place in its log and the watermarks this
   * daemon has seen for the shard, read at each attempt (a retry carries
   * what an earlier batch taught since).
   */
  private positionsOf(vshard: number, parts: readonly PendingPart[], from: number, to: number): ArrayBuffer | undefined {
    const streamLog = this.streamLog;
    if (streamLog === null) return undefined;
    return encodePositions({
      count: to - from,
      partition: (i) => parts[from + i]!.delivery.position!.partition,
      offset: (i) => parts[from + i]!.delivery.position!.offset,
      expected: (partition) => streamLog.expected(partition, vshard),
    });
  }
}

/** The threads were stopped while a batch was being retried: it is given up, its deliveries stay unacked. */
class BatchAbandoned extends Error {
  constructor() {
    super('batch abandoned: the worker threads stopped');
    this.name = 'BatchAbandoned';
  }
}
