import type { Redis } from 'ioredis';
import { COUNTER_NAMES, statsKey, zeroCounters, type CounterName, type CounterValues } from '@tally/shared';
import type { Logger } from './logger.js';

/**
 * Counts locally and adds the deltas to the `<prefix>stats` hash once a
 * second, so totals survive restarts and add up across daemons without a
 * Redis round trip per message. A SIGKILL loses at most the last second of
 * counter deltas (never counts); a failed flush keeps its deltas for the next.
 */
export class StatsRecorder {
  private readonly unflushed: CounterValues = zeroCounters();
  /** Since this process started; what the metrics endpoint exports. */
  readonly sinceStart: CounterValues = zeroCounters();
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly log: Logger,
  ) {}

  add(name: CounterName, amount = 1): void {
    if (amount === 0) return;
    this.unflushed[name] += amount;
    this.sinceStart[name] += amount;
  }

  start(intervalMs = 1_000): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.flush(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** Sends the accumulated deltas; concurrent calls share one round trip. */
  flush(): Promise<void> {
    this.flushing ??= this.flushOnce().finally(() => {
      this.flushing = null;
    });
    return this.flushing;
  }

  private async flushOnce(): Promise<void> {
    const deltas: Array<[CounterName, number]> = [];
    for (const name of COUNTER_NAMES) if (this.unflushed[name] !== 0) deltas.push([name, this.unflushed[name]]);
    if (deltas.length === 0) return;
    const pipeline = this.redis.pipeline();
    for (const [name, delta] of deltas) pipeline.hincrby(statsKey(this.prefix), name, delta);
    try {
      const results = await pipeline.exec();
      for (let i = 0; i < deltas.length; i++) {
        const [name, delta] = deltas[i]!;
        if (results?.[i]?.[0] == null) this.unflushed[name] -= delta;
      }
    } catch (error) {
      this.log.warn({ err: error instanceof Error ? error.message : String(error) }, 'stats flush failed; will retry');
    }
  }
}
