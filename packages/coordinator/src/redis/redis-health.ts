/**
 * Whether Redis is refusing Tally's writes right now (invariant 11 at run
 * time), gathered from every place that writes: the worker threads' batch
 * steps (their ThreadEvents, passed to apply() by worker-pools.ts; see
 * shared/src/redis-health.ts) and
 * the coordinator's own calls (stats flush, heartbeat).
 *
 * A refusal is a server state, not a bad message: the batch waits and
 * retries, nothing is acked, and this makes the wait visible: /readyz says
 * why (readiness.ts), the gauge and the counter move (metrics.ts), and one
 * log line marks its start and one its end.
 *
 * Pure bookkeeping plus a log; the clock is injectable for tests.
 */
import type { FailureClass, RedisHealthEvent } from '@tally/shared';
import type { Logger } from '../process/logger.js';

/**
 * A refusal not repeated for this long is forgotten: a step that keeps
 * failing reports each attempt (backoff capped at 5 s, a hung server's
 * command timeout at 10 s), so only a source that went away without saying
 * "recovered" (a thread that died mid-retry) stays silent this long.
 */
export const REFUSAL_STALE_MS = 30_000;

interface Refusal {
  readonly errorType: string;
  readonly failureClass: FailureClass;
  readonly message: string;
  readonly firstAtMs: number;
  lastAtMs: number;
}

export interface RedisRefusalState {
  /** The most recent refusal still in force. */
  readonly errorType: string;
  readonly failureClass: FailureClass;
  readonly message: string;
  /** When the current episode began (epoch ms): the first refusal after a time without any. */
  readonly sinceMs: number;
  /** Where it is seen: `shard 3`, `stats flush`, … */
  readonly sources: readonly string[];
}

export class RedisHealth {
  private readonly refusals = new Map<string, Refusal>();
  private episodeSinceMs: number | null = null;
  /** Refused attempts since start, by error type: the `tally.redis.refused_attempts` counter. */
  readonly attemptsByType = new Map<string, number>();

  constructor(
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  /** A worker thread's health event (thread-protocol.ts ThreadEvent `redis-health`). */
  apply(event: RedisHealthEvent): void {
    if (event.kind === 'refused') this.refused(event.source, event.errorType, event.failureClass, event.message);
    else this.recovered(event.source);
  }

  refused(source: string, errorType: string, failureClass: FailureClass, message: string): void {
    const now = this.now();
    this.attemptsByType.set(errorType, (this.attemptsByType.get(errorType) ?? 0) + 1);
    const before = this.current();
    const known = this.refusals.get(source);
    if (known !== undefined && known.errorType === errorType) known.lastAtMs = now;
    else this.refusals.set(source, { errorType, failureClass, message, firstAtMs: known?.firstAtMs ?? now, lastAtMs: now });
    if (before === null) {
      this.episodeSinceMs = now;
      this.log.warn({ errorType, failureClass, source, err: message }, `${describeKind(errorType)}: ${message}; waiting, nothing unwritten is acked`);
    }
  }

  recovered(source: string): void {
    if (!this.refusals.delete(source)) return;
    this.endIfClear();
  }

  /** The refusal in force, or null. */
  current(): RedisRefusalState | null {
    const now = this.now();
    let latest: Refusal | null = null;
    for (const [source, refusal] of this.refusals) {
      if (now - refusal.lastAtMs > REFUSAL_STALE_MS) {
        this.refusals.delete(source);
        continue;
      }
      if (latest === null || refusal.lastAtMs > latest.lastAtMs) latest = refusal;
    }
    if (latest === null) {
      this.endIfClear();
      return null;
    }
    return {
      errorType: latest.errorType,
      failureClass: latest.failureClass,
      message: latest.message,
      sinceMs: this.episodeSinceMs ?? latest.firstAtMs,
      sources: [...this.refusals.keys()],
    };
  }

  /** Error types currently refused (for the gauge). */
  refusingTypes(): Set<string> {
    this.current();
    return new Set([...this.refusals.values()].map((refusal) => refusal.errorType));
  }

  private endIfClear(): void {
    if (this.refusals.size > 0 || this.episodeSinceMs === null) return;
    const lastedMs = this.now() - this.episodeSinceMs;
    this.episodeSinceMs = null;
    this.log.info({ lastedMs }, 'redis accepts writes again');
  }
}

/** The start of /readyz's reason and of the log line. */
export function describeKind(errorType: string): string {
  return errorType === 'unavailable' ? 'redis unavailable' : 'redis refusing writes';
}
