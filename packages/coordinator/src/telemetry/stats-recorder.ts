/**
 * The counters of `<prefix>stats`: counted locally, flushed once a second (the deviation's and the
 * exposure's within 20 ms).
 */
import type { RedisClient } from '@tally/runtime';
import { COUNTER_NAMES, statsKey, zeroCounters, type CounterName, type CounterValues } from '@tally/shared';
import type { Logger } from '../process/logger.js';

/**
 * Counts locally and adds the deltas to the `<prefix>stats` hash once a
 * second, so totals survive restarts and add up across daemons without a
 * Redis round trip per message. A SIGKILL loses at most the last second of
 * counter deltas (never counts); a failed flush keeps its deltas for the next.
 *
 * The counters that report the deviation are the exception: they move in
 * the redelivery burst right after a restart, exactly when a crash loop
 * would keep killing the daemon before its next flush. So do the exposure
 * counters `tally deviation` divides (loaded_ms, window_message_ms,
 * occupied_unacked_message_ms): losing a second of them per kill would
 * leave out of the estimate most of what a daemon killed every second or so
 * was exposed to. All of them are flushed within URGENT_FLUSH_MS instead;
 * the exposure meter hands its figures over every 50 ms while under load,
 * so a loaded daemon flushes about 20 times a second.
 */
const URGENT: ReadonlySet<CounterName> = new Set([
  'occupation_failures',
  'redelivered_unmarked',
  'partial_duplicates',
  'count_errors',
  'claim_takeovers',
  'adopted',
  'loaded_ms',
  'window_message_ms',
  'occupied_unacked_message_ms',
]);
const URGENT_FLUSH_MS = 20;
export class StatsRecorder {
  private readonly unflushed: CounterValues = zeroCounters();
  /** Since this process started; what the metrics endpoint exports. */
  readonly sinceStart: CounterValues = zeroCounters();
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private urgentTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly redis: RedisClient,
    private readonly prefix: string,
    private readonly log: Logger,
    /** Told the outcome of every flush that wrote something: null on success, else the error (RedisHealth watches it). */
    private readonly onFlushOutcome: (error: unknown) => void = () => {},
  ) {}

  add(name: CounterName, amount = 1): void {
    if (amount === 0) return;
    this.unflushed[name] += amount;
    this.sinceStart[name] += amount;
    if (URGENT.has(name) && this.urgentTimer === null) {
      this.urgentTimer = setTimeout(() => {
        this.urgentTimer = null;
        // A flush already in flight took its snapshot before these deltas.
        void this.flush().then(() => this.flush());
      }, URGENT_FLUSH_MS);
    }
  }

  start(intervalMs = 1_000): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.flush(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.urgentTimer) clearTimeout(this.urgentTimer);
    this.urgentTimer = null;
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
      let refusal: unknown = null;
      for (let i = 0; i < deltas.length; i++) {
        const [name, delta] = deltas[i]!;
        const error = results?.[i]?.[0];
        if (error == null) this.unflushed[name] -= delta;
        else refusal ??= error;
      }
      this.onFlushOutcome(refusal);
      if (refusal !== null) this.log.warn({ err: refusal instanceof Error ? refusal.message : String(refusal) }, 'stats flush refused; will retry');
    } catch (error) {
      this.onFlushOutcome(error);
      this.log.warn({ err: error instanceof Error ? error.message : String(error) }, 'stats flush failed; will retry');
    }
  }
}
