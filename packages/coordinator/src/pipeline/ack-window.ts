/**
 * The acks of the live channels: which deliveries are finished (AckTracker,
 * invariant 7), when the acks go out, and the acks around a stalled head
 * (invariant 10). A delivery belongs to the channel it came on: after a
 * reconnect its tag means nothing on the new channel, so it is never acked
 * there (the broker redelivers it).
 *
 * With partitioned queues (TALLY_PARTITIONS > 1) every partition a daemon
 * holds has a channel of its own (partition-channels.ts), so each has its own
 * tracker, its own multiple-acks and its own stall: delivery tags are
 * numbered per channel, 1, 2, 3, … without gaps, which is what the tracker's
 * contiguous-run arithmetic needs, and a multiple-ack on one partition's
 * channel can never cover another partition's unfinished delivery. A
 * partition whose head is stuck holds back only its own acks and its own
 * prefetch credit.
 */
import { AckTracker } from './ack-tracker.js';
import type { ChannelLink } from './delivery.js';
import type { Logger } from '../process/logger.js';
import type { Acker, Clock, Exposure } from './ports.js';

/** One live channel's bookkeeping. */
interface ChannelAcks {
  readonly channel: ChannelLink;
  readonly tracker: AckTracker;
  /** Since when (epoch ms) its head has been stalled and single acks are going out; null when it is not. */
  stalledSince: number | null;
}

/** One live channel's figures, for the per-partition gauges and the heartbeat. */
export interface ChannelFigures {
  /** The partition the channel consumes; null with one queue (TALLY_PARTITIONS=1). */
  readonly partition: number | null;
  readonly unacked: number;
  readonly oldestUnackedAgeMs: number | null;
}

/** What the ack window works with. */
export interface AckWindowDeps {
  readonly acker: Acker;
  readonly exposure: Exposure;
  readonly clock: Clock;
  readonly log: Logger;
}

export class AckWindow {
  private readonly acker: Acker;
  private readonly exposure: Exposure;
  private readonly clock: Clock;
  private readonly log: Logger;
  /** The live channels, in the order they came up; a channel leaves when it is lost or closed. */
  private readonly live = new Map<ChannelLink, ChannelAcks>();
  private sendScheduled = false;
  /** A bug was met (invariant 13): no ack goes out any more, whatever finishes. */
  private halted = false;

  constructor(
    deps: AckWindowDeps,
    /** TALLY_STALL_MS. */
    private readonly stallMs: number,
  ) {
    ({ acker: this.acker, exposure: this.exposure, clock: this.clock, log: this.log } = deps);
  }

  channelUp(channel: ChannelLink): void {
    // One queue: a new channel replaces the old one, whose deliveries are the broker's again (as before partitions).
    if (channel.partition === undefined) for (const old of this.live.keys()) if (old.partition === undefined) this.channelDown(old);
    this.live.set(channel, { channel, tracker: new AckTracker(), stalledSince: null });
    this.exposure.channelChanged(channel);
  }

  /** The channel is gone: returns how many of its deliveries were unacked, or null when it was not a live one. */
  channelDown(channel: ChannelLink): number | null {
    const acks = this.live.get(channel);
    if (acks === undefined) return null;
    this.live.delete(channel);
    this.exposure.channelClosed(channel);
    return acks.tracker.unacked;
  }

  /** Records a delivery; false when it came on a channel that is no longer a live one (it will be redelivered). */
  received(channel: ChannelLink, tag: number): boolean {
    const acks = this.live.get(channel);
    if (acks === undefined) return false;
    acks.tracker.received(tag, this.clock.now());
    return true;
  }

  /** A delivery is done (counted, a duplicate, empty, or dead-lettered): its ack goes out with this turn's others. */
  finish(channel: ChannelLink, tag: number): void {
    const tracker = this.trackerOf(channel);
    if (tracker === null) return;
    tracker.finish(tag);
    this.scheduleSend();
  }

  /**
   * A delivery waits for another daemon's claim (up to the claim TTL, e.g.
   * after that daemon was killed): the finished ones behind it go out one by
   * one at once instead of waiting for it (ack-tracker.ts).
   */
  heldByClaim(channel: ChannelLink, tag: number): void {
    this.trackerOf(channel)?.heldByClaim(tag);
  }

  /** From now on nothing is acked: the state the broken code left cannot be trusted; the broker redelivers. */
  halt(): void {
    this.halted = true;
  }

  /** Coalesces: every completion of this turn is covered by one multiple-ack per channel. */
  scheduleSend(): void {
    if (this.sendScheduled) return;
    this.sendScheduled = true;
    setImmediate(() => {
      this.sendScheduled = false;
      this.send();
    });
  }

  /**
   * For each live channel, the normal path: one multiple-ack for the
   * finished run at the head. Then, when the head has been unfinished for
   * TALLY_STALL_MS (or at once when it waits for another daemon's claim),
   * the finished deliveries behind it one by one: they must not wait for it
   * until consumer_timeout closes the channel and they are counted again.
   */
  send(): void {
    if (this.halted) return;
    for (const acks of this.live.values()) this.sendOn(acks);
  }

  private sendOn(acks: ChannelAcks): void {
    const { channel, tracker } = acks;
    const upTo = tracker.takeAckable();
    if (upTo !== null) {
      this.acker.ack(channel, upTo, true);
      this.exposure.acked(channel, upTo);
    }
    const single = tracker.takeStalledAcks(this.stallMs, this.clock.now());
    for (const tag of single) {
      this.acker.ack(channel, tag, false);
      this.exposure.ackedOne(channel, tag);
    }
    this.noteStall(acks, single.length);
  }

  /** Deliveries of the live channels not yet acked (finished or not). */
  get unacked(): number {
    let sum = 0;
    for (const { tracker } of this.live.values()) sum += tracker.unacked;
    return sum;
  }

  /** Deliveries of one channel not yet acked: what holds that channel's prefetch credit (0 for a channel that is not live). */
  unackedOn(channel: ChannelLink): number {
    return this.live.get(channel)?.tracker.unacked ?? 0;
  }

  /** Age of the oldest unacked delivery over the live channels; null when nothing is unacked. */
  oldestUnackedAgeMs(): number | null {
    let oldest: number | null = null;
    const now = this.clock.now();
    for (const { tracker } of this.live.values()) {
      const age = tracker.oldestUnackedAgeMs(now);
      if (age !== null && (oldest === null || age > oldest)) oldest = age;
    }
    return oldest;
  }

  /** Each live channel's figures, in the order the channels came up. */
  channels(): ChannelFigures[] {
    const now = this.clock.now();
    return [...this.live.values()].map(({ channel, tracker }) => ({
      partition: channel.partition ?? null,
      unacked: tracker.unacked,
      oldestUnackedAgeMs: tracker.oldestUnackedAgeMs(now),
    }));
  }

  private trackerOf(channel: ChannelLink): AckTracker | null {
    const acks = this.live.get(channel);
    return acks !== undefined && channel.alive ? acks.tracker : null;
  }

  /** One log line when a channel's stall begins (and each time it acks around it, at debug), one when it ends. */
  private noteStall(acks: ChannelAcks, singleAcks: number): void {
    const { tracker } = acks;
    const ageMs = tracker.oldestUnackedAgeMs(this.clock.now());
    const stalled = ageMs !== null && ageMs >= this.stallMs && tracker.inProgress > 0;
    const partition = acks.channel.partition;
    const where = partition === undefined ? {} : { partition };
    if (stalled && acks.stalledSince === null) {
      acks.stalledSince = this.clock.epochMs();
      this.log.warn(
        { ...where, oldestUnackedS: Math.round(ageMs) / 1000, stallMs: this.stallMs, singleAcks, inProgress: tracker.inProgress },
        'stalled: the oldest unacked delivery has not finished; acking the finished ones behind it one by one',
      );
    } else if (stalled && singleAcks > 0) this.log.debug({ ...where, singleAcks }, 'acked finished deliveries behind the stalled one');
    else if (!stalled && acks.stalledSince !== null) {
      this.log.info({ ...where, stalledMs: this.clock.epochMs() - acks.stalledSince }, 'stall over: the oldest unacked delivery finished');
      acks.stalledSince = null;
    }
  }
}
