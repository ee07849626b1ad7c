/**
 * How much a crash would cost, measured while the daemon runs, for the
 * deviation estimator (`tally deviation`). Two figures, each a time integral
 * in message-milliseconds, added to the `<prefix>stats` hash with the other
 * counters so they survive restarts and add up across daemons:
 *
 * - `window_message_ms`: messages inside the crash window (counts written,
 *   markers not yet). A crash re-counts these whatever its recovery time.
 * - `occupied_unacked_message_ms`: messages whose markers are occupied but
 *   whose delivery is not acked yet. Acks are contiguous multiple-acks, so a
 *   finished delivery waits for every earlier tag: this can be a sizeable
 *   share of the prefetch window. A crash re-counts these only when its
 *   recovery outlasts the marker TTL (the markers expired before the
 *   redelivery).
 *
 * Both are taken only while the daemon is under load (at least half of the
 * prefetch window unacked), and `loaded_ms` is that time: divided by it each
 * gives the mean number of messages at risk when a crash hits a loaded
 * daemon. Averaging over lightly loaded time instead (a backlog's tail, a
 * trickle) would understate a crash under load by half or more: the fault
 * suite measured it.
 *
 * A message with parts on several shards counts as 1/parts per part, so a
 * half-finished delivery is half a message at risk.
 */
import type { BatchResult, CounterName } from '@tally/shared';

export interface ExposureSink {
  add(name: CounterName, amount: number): void;
}

/** The share of one part in its message, and the delivery it belongs to. */
export interface ExposedPart {
  readonly link: unknown;
  readonly tag: number;
  readonly parts: number;
}

export class ExposureMeter {
  /** The live channel: tags of other channels mean nothing here. */
  private link: unknown = null;
  /** Occupied share (in messages) of each unacked delivery tag of the live channel. */
  private readonly occupiedByTag = new Map<number, number>();
  private ackedThrough = 0;
  private occupiedUnacked = 0;
  /** Fractions not yet handed to the sink (the stats hash takes integers). */
  private readonly carry = { loaded: 0, window: 0, occupied: 0 };
  private lastSample = performance.now();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly sink: ExposureSink,
    /** Whether the daemon is under load right now. */
    private readonly loaded: () => boolean,
    /** Atomic mode writes counts and markers in one step: it has no window. */
    private readonly hasWindow: boolean,
  ) {}

  /** A new channel: the old channel's deliveries go back to the broker while their markers are fresh. */
  channelChanged(link: unknown): void {
    this.link = link;
    this.occupiedByTag.clear();
    this.ackedThrough = 0;
    this.occupiedUnacked = 0;
  }

  /** A shard batch reported done: its parts are occupied (or found occupied). */
  batchDone(parts: readonly ExposedPart[], timings: BatchResult['timings']): void {
    let messages = 0;
    for (const part of parts) {
      const share = 1 / part.parts;
      messages += share;
      this.occupied(part.link, part.tag, share);
    }
    if (!this.hasWindow || !this.loaded()) return;
    // The window runs from when Redis executes the count transaction to when
    // it executes the marker SETs. The worker sees each end one reply latency
    // later, and the two latencies cancel out: the window lasts about the
    // occupy round trip (t2 -> t3), not the write one. Retries while Redis is
    // away keep the occupy step, and so the window, open: that is counted too.
    this.carry.window += messages * timings.occupyMs;
  }

  /** A whole delivery settled without a batch of its own (a copy that waited for its first). */
  occupied(link: unknown, tag: number, share: number): void {
    if (link !== this.link || tag <= this.ackedThrough) return;
    this.occupiedByTag.set(tag, (this.occupiedByTag.get(tag) ?? 0) + share);
    this.occupiedUnacked += share;
  }

  /** Every tag up to `upTo` is acked on the live channel. */
  acked(upTo: number): void {
    for (let tag = this.ackedThrough + 1; tag <= upTo; tag++) {
      const share = this.occupiedByTag.get(tag);
      if (share === undefined) continue;
      this.occupiedByTag.delete(tag);
      this.occupiedUnacked -= share;
    }
    this.ackedThrough = Math.max(this.ackedThrough, upTo);
    // Floating-point sums drift; an empty map is exactly zero.
    if (this.occupiedByTag.size === 0) this.occupiedUnacked = 0;
  }

  /** One tag above the contiguous run was acked on its own (behind a stalled head). */
  ackedOne(tag: number): void {
    const share = this.occupiedByTag.get(tag);
    if (share === undefined) return;
    this.occupiedByTag.delete(tag);
    this.occupiedUnacked -= share;
    if (this.occupiedByTag.size === 0) this.occupiedUnacked = 0;
  }

  /** Integrates the occupied-unacked figure and loaded time since the last sample. */
  sample(now = performance.now()): void {
    const elapsed = now - this.lastSample;
    this.lastSample = now;
    if (elapsed > 0 && this.loaded()) {
      this.carry.loaded += elapsed;
      this.carry.occupied += this.occupiedUnacked * elapsed;
    }
    this.hand('loaded_ms', 'loaded');
    this.hand('window_message_ms', 'window');
    this.hand('occupied_unacked_message_ms', 'occupied');
  }

  start(intervalMs = 50): void {
    if (this.timer) return;
    this.lastSample = performance.now();
    this.timer = setInterval(() => this.sample(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.sample();
  }

  private hand(name: CounterName, key: 'loaded' | 'window' | 'occupied'): void {
    const whole = Math.floor(this.carry[key]);
    if (whole <= 0) return;
    this.carry[key] -= whole;
    this.sink.add(name, whole);
  }
}
