/**
 * The acks of the live channel: which deliveries are finished (AckTracker,
 * invariant 7), when the acks go out, and the acks around a stalled head
 * (invariant 10). A delivery belongs to the channel it came on: after a
 * reconnect its tag means nothing on the new channel, so it is never acked
 * there (the broker redelivers it).
 */
import { AckTracker } from '../ack-tracker.js';
import type { ChannelLink } from '../delivery.js';
import type { Logger } from '../logger.js';
import type { Acker, Clock, Exposure } from './ports.js';

export class AckWindow {
  /** The live channel and its bookkeeping; null between a channel's loss and the next one. */
  private live: { readonly channel: ChannelLink; readonly tracker: AckTracker } | null = null;
  private sendScheduled = false;
  /** Since when (epoch ms) the head has been stalled and single acks are going out; null when it is not. */
  private stalledSince: number | null = null;
  /** A bug was met (invariant 13): no ack goes out any more, whatever finishes. */
  private halted = false;

  constructor(
    private readonly acker: Acker,
    private readonly exposure: Exposure,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly stallMs: number,
  ) {}

  channelUp(channel: ChannelLink): void {
    this.live = { channel, tracker: new AckTracker() };
    this.exposure.channelChanged(channel);
  }

  /** The channel is gone: returns how many of its deliveries were unacked, or null when it was not the live one. */
  channelDown(channel: ChannelLink): number | null {
    if (this.live?.channel !== channel) return null;
    const unacked = this.live.tracker.unacked;
    this.live = null;
    return unacked;
  }

  /** Records a delivery; false when it came on a channel that is no longer the live one (it will be redelivered). */
  received(channel: ChannelLink, tag: number): boolean {
    if (this.live?.channel !== channel) return false;
    this.live.tracker.received(tag, this.clock.now());
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

  /** Coalesces: every completion of this turn is covered by one multiple-ack. */
  scheduleSend(): void {
    if (this.sendScheduled) return;
    this.sendScheduled = true;
    setImmediate(() => {
      this.sendScheduled = false;
      this.send();
    });
  }

  /**
   * The normal path: one multiple-ack for the finished run at the head. Then,
   * when the head has been unfinished for TALLY_STALL_MS (or at once when it
   * waits for another daemon's claim), the finished deliveries behind it one
   * by one: they must not wait for it until consumer_timeout closes the
   * channel and they are counted again.
   */
  send(): void {
    const live = this.live;
    if (live === null || this.halted) return;
    const { channel, tracker } = live;
    const upTo = tracker.takeAckable();
    if (upTo !== null) {
      this.acker.ack(channel, upTo, true);
      this.exposure.acked(upTo);
    }
    const single = tracker.takeStalledAcks(this.stallMs, this.clock.now());
    for (const tag of single) {
      this.acker.ack(channel, tag, false);
      this.exposure.ackedOne(tag);
    }
    this.noteStall(tracker, single.length);
  }

  /** Deliveries of the live channel not yet acked (finished or not): what holds prefetch credit. */
  get unacked(): number {
    return this.live?.tracker.unacked ?? 0;
  }

  /** Age of the oldest unacked delivery of the live channel; null when nothing is unacked. */
  oldestUnackedAgeMs(): number | null {
    return this.live?.tracker.oldestUnackedAgeMs(this.clock.now()) ?? null;
  }

  private trackerOf(channel: ChannelLink): AckTracker | null {
    const live = this.live;
    return live !== null && live.channel === channel && channel.alive ? live.tracker : null;
  }

  /** One log line when a stall begins (and each time it acks around it, at debug), one when it ends. */
  private noteStall(tracker: AckTracker, singleAcks: number): void {
    const ageMs = tracker.oldestUnackedAgeMs(this.clock.now());
    const stalled = ageMs !== null && ageMs >= this.stallMs && tracker.inProgress > 0;
    if (stalled && this.stalledSince === null) {
      this.stalledSince = this.clock.epochMs();
      this.log.warn(
        { oldestUnackedS: Math.round(ageMs) / 1000, stallMs: this.stallMs, singleAcks, inProgress: tracker.inProgress },
        'stalled: the oldest unacked delivery has not finished; acking the finished ones behind it one by one',
      );
    } else if (stalled && singleAcks > 0) this.log.debug({ singleAcks }, 'acked finished deliveries behind the stalled one');
    else if (!stalled && this.stalledSince !== null) {
      this.log.info({ stalledMs: this.clock.epochMs() - this.stalledSince }, 'stall over: the oldest unacked delivery finished');
      this.stalledSince = null;
    }
  }
}
