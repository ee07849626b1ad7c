/**
 * The worker threads: one single-thread piscina pool per owner thread, and the requests, replies and events
 * that cross to them.
 */
import { Piscina } from 'piscina';
import {
  ClassifiedFailure,
  isThreadEvent,
  isThreadReply,
  ownerOf,
  transferListOf,
  UnknownReplyError,
  type BatchResult,
  type ThreadEvent,
  type ThreadReply,
  type ThreadRequest,
  type ThreadRequestKind,
  type WireBatchTask,
  type WorkerSettings,
} from '@tally/shared';
import { WORKER_THREAD_FILE } from '@tally/worker';

/**
 * One single-thread piscina pool per owner: virtual shard v always runs on
 * thread `v % threads`. Each thread runs the batches of all the shards it
 * owns concurrently (their Redis round trips overlap), but never two
 * batches of one shard (ShardLanes guarantees that).
 */
export class WorkerPools {
  private readonly pools: Piscina[];

  /** `onEvent` receives what a thread posts while a batch runs (thread-protocol.ts ThreadEvent). */
  constructor(settings: WorkerSettings, threads: number, virtualShards: number, onEvent: (event: ThreadEvent) => void = () => {}) {
    const shardsPerThread = Math.ceil(virtualShards / threads);
    this.pools = Array.from(
      { length: threads },
      (_, index) =>
        new Piscina({
          filename: WORKER_THREAD_FILE,
          name: 'default',
          minThreads: 1,
          maxThreads: 1,
          idleTimeout: Number.MAX_SAFE_INTEGER,
          concurrentTasksPerWorker: shardsPerThread,
          // 'sync' would park an idle thread in Atomics.wait, freezing its
          // event loop: ioredis could not reconnect and the span exporter's
          // timers would not fire between batches.
          atomics: 'async',
          workerData: settings,
          env: { ...process.env, TALLY_THREAD_INDEX: String(index) },
        }),
    );
    for (const pool of this.pools)
      pool.on('message', (event: unknown) => {
        if (isThreadEvent(event)) onEvent(event);
      });
  }

  private destroyed = false;

  /** True once destroy() began: no batch runs any more, a retry loop should stop. */
  get stopped(): boolean {
    return this.destroyed;
  }

  /**
   * Runs a batch on its owner thread. A failure the thread reported comes
   * back as a ClassifiedFailure with the class (and, for a bug, the stack)
   * the thread gave it; a thread that died rejects with piscina's "worker
   * exited" error (transient); an answer of an unknown shape is a bug
   * (UnknownReplyError).
   */
  async run(task: WireBatchTask): Promise<BatchResult> {
    if (this.destroyed) throw new Error('worker threads stopped');
    const pool = this.pools[ownerOf(task.vshard, this.pools.length)]!;
    // The task's buffer is moved, not cloned: the clone of the flat array it
    // replaced cost the main thread about 1 µs per message (docs/benchmark.md).
    // A rerun after a failure encodes the task again (shard-batches.ts).
    const reply = await request(pool, { kind: 'batch', task }, transferListOf(task));
    if (reply.kind === 'batch-failed') throw new ClassifiedFailure(reply.failureClass, reply.message, reply.stack);
    return reply.result;
  }

  /**
   * Starts every thread and connects it to Redis (the thread's `warm`).
   * Best effort: a thread that cannot connect yet fails its batches the
   * usual way (retried, logged), so a failure here is not reported twice.
   */
  async warm(): Promise<void> {
    await Promise.allSettled(this.pools.map((pool) => request(pool, { kind: 'warm' })));
  }

  /** Asks every thread to export its buffered spans (a no-op when tracing is off). */
  async flushTelemetry(): Promise<void> {
    await Promise.allSettled(this.pools.map((pool) => request(pool, { kind: 'flush-telemetry' })));
  }

  /**
   * Terminates every thread, a batch in the middle of a Redis call
   * included: piscina rejects its task and the thread's connection closes.
   * The daemon calls this before the channel closes, so no thread is still
   * writing once the broker hands the deliveries to another consumer.
   */
  async destroy(): Promise<void> {
    this.destroyed = true;
    await Promise.allSettled(this.pools.map((pool) => pool.destroy()));
  }
}

/** Sends one request to a pool's thread and checks that the reply is that request's (thread-protocol.ts). */
async function request<R extends ThreadRequest>(pool: Piscina, message: R, transferList?: ArrayBuffer[]): Promise<ThreadReply<R['kind']>> {
  const reply: unknown = await pool.run(message, transferList === undefined ? {} : { transferList });
  if (!isThreadReply<ThreadRequestKind>(message.kind, reply)) throw new UnknownReplyError('a worker thread', reply);
  return reply as ThreadReply<R['kind']>;
}
