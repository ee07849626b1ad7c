/**
 * The log lines for bad messages: each one up to a rate per reason, then one sum per reason.
 */
import type { Logger } from '../process/logger.js';

/**
 * One log line per bad message would let a storm of them flood the logs.
 * The first few of each reason per minute are logged in full; the rest are
 * summed into one line per reason when the minute ends.
 */
export class BadMessageLog {
  private windowStart = Date.now();
  private readonly perReason = new Map<string, number>();

  constructor(
    private readonly log: Logger,
    private readonly fullPerWindow = 5,
    private readonly windowMs = 60_000,
  ) {}

  record(code: string, reason: string, messageId: unknown): void {
    const now = Date.now();
    if (now - this.windowStart >= this.windowMs) this.rollOver(now);
    const seen = (this.perReason.get(code) ?? 0) + 1;
    this.perReason.set(code, seen);
    if (seen <= this.fullPerWindow) {
      this.log.warn({ reason, messageId: typeof messageId === 'string' ? messageId.slice(0, 256) : undefined }, 'bad message dead-lettered');
    }
  }

  private rollOver(now: number): void {
    for (const [code, seen] of this.perReason) {
      if (seen > this.fullPerWindow) {
        this.log.warn({ code, suppressed: seen - this.fullPerWindow, windowMs: this.windowMs }, 'more bad messages dead-lettered (not logged one by one)');
      }
    }
    this.perReason.clear();
    this.windowStart = now;
  }
}
