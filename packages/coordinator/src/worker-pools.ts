import { Piscina } from 'piscina';
import { ClassifiedFailure, ownerOf, type BatchReply, type BatchResult, type ThreadEvent, type WireBatchTask, type WorkerSettings } from '@tally/shared';
import { WORKER_THREAD_FILE } from '@tally/worker';

/**
 * One single-thread piscina pool per owner: virtual shard v always runs on
 * thread `v % threads`. Each thread runs the batches of all the shards it
 * owns concurrently (their Redis round trips overlap), but never two
 * batches of one shard (ShardLanes guarantees that).
 */
export class WorkerPools {
  private readonly pools: Piscina[];

  /** `onEvent` receives what a thread posts while a batch runs (batch-protocol.ts ThreadEvent). */
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
    for (const pool of this.pools) pool.on('message', (event: ThreadEvent) => onEvent(event));
  }

  /**
   * Runs a batch on its owner thread. A failure the thread reported comes
   * back as a ClassifiedFailure with the class the thread gave it; a thread
   * that died rejects with piscina's "worker exited" error (transient).
   */
  async run(task: WireBatchTask): Promise<BatchResult> {
    const pool = this.pools[ownerOf(task.vshard, this.pools.length)]!;
    const reply = (await pool.run(task)) as BatchReply;
    if (!reply.ok) throw new ClassifiedFailure(reply.failureClass, reply.message);
    return reply.result;
  }

  /** Asks every thread to export its buffered spans (a no-op when tracing is off). */
  async flushTelemetry(): Promise<void> {
    await Promise.allSettled(this.pools.map((pool) => pool.run(null, { name: 'flushTelemetry' })));
  }

  async destroy(): Promise<void> {
    await Promise.allSettled(this.pools.map((pool) => pool.destroy()));
  }
}
