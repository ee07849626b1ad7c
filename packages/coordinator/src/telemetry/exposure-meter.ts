/**
 * How much a crash would cost, measured while the daemon runs, for the
 * deviation estimator (`tally deviation`). Two figures, each a time integral
 * in message-milliseconds, added to the `<prefix>stats` hash with the other
 * counters so they survive restarts and add up across daemons:
 *
 * - `window_message_ms`: messages inside the crash window: their count
 *   write has been sent to Redis, their marker occupation not yet. A crash
 *   re-counts these whatever its recovery time. The worker threads publish
 *   them as they go (shared WindowGauge) and the meter samples the gauge,
 *   so a window still open when the daemon is killed is counted up to the
 *   last sample instead of being lost with the batch's result.
 * - `occupied_unacked_message_ms`: messages whose markers are occupied but
 *   whose delivery is not acked yet. Acks are contiguous multiple-acks, so a
 *   finished delivery waits for every earlier tag: this can be a sizeable
 *   share of the prefetch window. A crash re-counts these only when its
 *   recovery outlasts the marker TTL (the markers expired before the
 *   redelivery). Counted from the moment the batch's marker occupation is sent
 *   (the gauge's settling slots, until the coordinator takes the result;
 *   then the occupied map, until the ack): the window term stops there.
 *
 * All are sampled every 50 ms, and all are taken only while the daemon is under load (at least half of the
 * prefetch window unacked), and `loaded_ms` is that time: divided by it each
 * gives the mean number of messages at risk when a crash hits a loaded
 * daemon. Averaging over lightly loaded time instead (a backlog's tail, a
 * trickle) would dilute the figure with moments when little is at risk, and
 * so understate what a crash under load costs (the fault suite's figures are
 * in docs/benchmark.md and docs/faults-and-deviation.md).
 *
 * A message with parts on several shards counts as 1/parts per part, so a
 * half-finished delivery is half a message at risk.
 *
 * A sample interval far longer than the sampling period means the process
 * was not running in between (SIGSTOP, a paused VM, a suspended container):
 * nothing could have been crashed into during that time, and what the
 * gauges show at the end of it stood still. Such an interval is left out
 * (longer than `maxGapMs`, 10 periods by default), instead of counting a
 * frozen second of loaded time with the window the daemon froze in. An event
 * loop merely late by a few periods is still counted.
 */
import type { CounterName } from '@tally/shared';
import { TagShares } from './tag-shares.js';

/** How often the meter samples, and the longest interval it still integrates. */
export interface MeterSampling {
  readonly periodMs: number;
  readonly maxGapMs: number;
}

export const DEFAULT_SAMPLING: MeterSampling = { periodMs: 50, maxGapMs: 500 };

/** Messages whose marker occupation is sent and whose batch result the coordinator has not taken yet. */
export interface SettlingGauge {
  settling(): number;
  settled(vshard: number): void;
}

export interface ExposureSink {
  add(name: CounterName, amount: number): void;
}

/** The share of one part in its message, and the delivery it belongs to. */
export interface ExposedPart {
  readonly link: unknown;
  readonly tag: number;
  readonly parts: number;
}

/** What the meter reads and where it writes. */
export interface ExposureDeps {
  readonly sink: ExposureSink;
  /** Whether the daemon is under load right now. */
  loaded(): boolean;
  /**
   * Messages inside a crash window right now (the worker threads' window
   * gauge); null in atomic mode and for a stream, which have no window.
   */
  readonly windowNow: (() => number) | null;
  /** The gauge's settling messages (markers sent, result not yet here); null without a window. */
  readonly settling?: SettlingGauge | null;
}

export class ExposureMeter {
  private readonly sink: ExposureSink;
  private readonly loaded: () => boolean;
  private readonly windowNow: (() => number) | null;
  private readonly settling: SettlingGauge | null;
  /** The live channels (one per partition held; one with a single queue), each with its unacked tags' occupied shares. */
  private readonly channels = new Map<unknown, TagShares>();
  /** Summed over the live channels. */
  private occupiedUnacked = 0;
  /** Fractions not yet handed to the sink (the stats hash takes integers). */
  private readonly carry = { loaded: 0, window: 0, occupied: 0 };
  private lastSample = performance.now();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    deps: ExposureDeps,
    private readonly sampling: MeterSampling = DEFAULT_SAMPLING,
  ) {
    this.sink = deps.sink;
    this.loaded = () => deps.loaded();
    this.windowNow = deps.windowNow;
    this.settling = deps.settling ?? null;
  }

  /** The coordinator has a shard's batch result, or its failure. */
  batchReturned(vshard: number): void {
    this.settling?.settled(vshard);
  }

  /** A new channel: its deliveries are tracked from now on. */
  channelChanged(link: unknown): void {
    this.channels.set(link, new TagShares());
  }

  /** A channel is gone: its deliveries go back to the broker while their markers are fresh. */
  channelClosed(link: unknown): void {
    const channel = this.channels.get(link);
    if (channel === undefined) return;
    this.channels.delete(link);
    this.occupiedUnacked -= channel.total();
    this.settleDrift();
  }

  /** Floating-point sums drift; no occupied delivery anywhere is exactly zero. */
  private settleDrift(): void {
    for (const channel of this.channels.values()) if (channel.size > 0) return;
    this.occupiedUnacked = 0;
  }

  /** A shard batch reported done: its parts are occupied (or found occupied). */
  batchDone(parts: readonly ExposedPart[]): void {
    for (const part of parts) this.occupied(part.link, part.tag, 1 / part.parts);
  }

  /** A whole delivery settled without a batch of its own (a copy that waited for its first). */
  occupied(link: unknown, tag: number, share: number): void {
    if (this.channels.get(link)?.add(tag, share)) this.occupiedUnacked += share;
  }

  /** Every tag up to `upTo` is acked on the channel `link`. */
  acked(link: unknown, upTo: number): void {
    const channel = this.channels.get(link);
    if (channel === undefined) return;
    this.occupiedUnacked -= channel.ackThrough(upTo);
    if (channel.size === 0) this.settleDrift();
  }

  /** One tag above the contiguous run was acked on its own (behind a stalled head). */
  ackedOne(link: unknown, tag: number): void {
    const channel = this.channels.get(link);
    if (channel === undefined) return;
    this.occupiedUnacked -= channel.ackOne(tag);
    if (channel.size === 0) this.settleDrift();
  }

  /** Integrates loaded time and the two figures at risk over it since the last sample. */
  sample(now = performance.now()): void {
    const elapsed = now - this.lastSample;
    this.lastSample = now;
    // Longer than maxGapMs: the process was frozen (see the file's comment).
    if (elapsed > 0 && elapsed <= this.sampling.maxGapMs && this.loaded()) {
      this.carry.loaded += elapsed;
      this.carry.occupied += (this.occupiedUnacked + (this.settling?.settling() ?? 0)) * elapsed;
      if (this.windowNow !== null) this.carry.window += this.windowNow() * elapsed;
    }
    this.hand('loaded_ms', 'loaded');
    this.hand('window_message_ms', 'window');
    this.hand('occupied_unacked_message_ms', 'occupied');
  }

  start(): void {
    if (this.timer) return;
    this.lastSample = performance.now();
    this.timer = setInterval(() => this.sample(), this.sampling.periodMs);
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
