import { Piscina } from 'piscina';
import { ownerOf, type BatchResult, type WireBatchTask, type WorkerSettings } from '@tally/shared';
import { WORKER_THREAD_FILE } from '@tally/worker';

/**
 * One single-thread piscina pool per owner: virtual shard v always runs on
 * thread `v % threads`. Each thread runs the batches of all the shards it
 * owns concurrently (their Redis round trips overlap), but never two
 * batches of one shard (ShardLanes guarantees that).
 */
export class WorkerPools {
  private readonly pools: Piscina[];

  constructor(settings: WorkerSettings, threads: number, virtualShards: number) {
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
  }

  private destroyed = false;

  /** True once destroy() began: no batch runs any more, a retry loop should stop. */
  get stopped(): boolean {
    return this.destroyed;
  }

  run(task: WireBatchTask): Promise<BatchResult> {
    if (this.destroyed) return Promise.reject(new Error('worker threads stopped'));
    const pool = this.pools[ownerOf(task.vshard, this.pools.length)]!;
    return pool.run(task) as Promise<BatchResult>;
  }

  /** Asks every thread to export its buffered spans (a no-op when tracing is off). */
  async flushTelemetry(): Promise<void> {
    await Promise.allSettled(this.pools.map((pool) => pool.run(null, { name: 'flushTelemetry' })));
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
