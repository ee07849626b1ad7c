/**
 * Exact acks for one channel (invariant 7). Shards finish out of order; a
 * multiple-ack may cover only a contiguous run of finished delivery tags,
 * and a tag acked twice closes the channel (PRECONDITION_FAILED). Pure: the
 * caller sends the acks this returns.
 *
 * RabbitMQ numbers deliveries on a channel 1, 2, 3, … with no gaps, so
 * "every tag below N is finished" is a single integer.
 *
 * Two ways out for a finished tag:
 *
 * - the normal path, takeAckable(): one multiple-ack for the contiguous run
 *   of finished tags at the head. Cheap: one frame for hundreds of deliveries.
 * - a stalled head, takeStalledAcks(): when the lowest unacked delivery has
 *   been unfinished for `stallMs`, every finished tag behind it is handed out
 *   for a single ack (multiple=false) and remembered as acked, so it is not
 *   held hostage until RabbitMQ's consumer_timeout closes the channel and
 *   redelivers it after its markers expired (invariant 10).
 * - a head held by another daemon's claim (two-step, heldByClaim()): the
 *   same single acks at once, without waiting for `stallMs`. Such a head
 *   waits up to the claim TTL by design (after a crash, for every message
 *   the dead daemon had claimed); with the acks behind it held too, the
 *   prefetch window filled and a restarted daemon counted nothing for that
 *   long.
 *
 * When the head finally finishes, the multiple-ack that follows ends on the
 * highest tag of the run that is still outstanding, never on a singly acked
 * one: a multiple-ack acks every *outstanding* tag up to N, so singly acked
 * tags below N are simply not among them, but N itself must be outstanding
 * (an ack naming an already-acked tag is "unknown delivery tag"). The
 * broker-side test (stalled-head.test.ts) checks both facts.
 */
export class AckTracker {
  /** Lowest tag not yet acked (by a multiple-ack; tags above it may be singly acked). */
  private nextToAck = 1;
  private highestReceived = 0;
  /** Finished and not acked yet. */
  private readonly finished = new Set<number>();
  /** Above nextToAck and already acked one by one because the head stalled. */
  private readonly singlyAcked = new Set<number>();
  /** When each unacked tag was received (ms, caller's clock): the oldest unacked age is the lowest tag's. */
  private readonly receivedAt = new Map<number, number>();
  /** Unfinished tags waiting for another daemon's claim to end. */
  private readonly held = new Set<number>();

  /** Records a delivery; tags must arrive in order without gaps. */
  received(tag: number, atMs: number = performance.now()): void {
    if (tag !== this.highestReceived + 1) {
      throw new RangeError(`delivery tag ${tag} out of sequence: expected ${this.highestReceived + 1}`);
    }
    this.highestReceived = tag;
    this.receivedAt.set(tag, atMs);
  }

  /** Marks a delivery finished. Finishing a tag twice is a bug and throws. */
  finish(tag: number): void {
    if (tag < this.nextToAck || tag > this.highestReceived || this.finished.has(tag) || this.singlyAcked.has(tag)) {
      throw new RangeError(`delivery tag ${tag} finished twice or never received`);
    }
    this.finished.add(tag);
    this.held.delete(tag);
  }

  /**
   * Marks an unfinished delivery as waiting for another daemon's claim: while
   * it is the head, the finished tags behind it are single-acked at once
   * (takeStalledAcks). Cleared when it finishes.
   */
  heldByClaim(tag: number): void {
    if (tag < this.nextToAck || tag > this.highestReceived || this.finished.has(tag) || this.singlyAcked.has(tag)) {
      throw new RangeError(`delivery tag ${tag} held after it finished, or never received`);
    }
    this.held.add(tag);
  }

  /**
   * The tag to ack with multiple=true, covering every outstanding tag up to
   * it, or null when the lowest unacked delivery is still in progress.
   */
  takeAckable(): number | null {
    let next = this.nextToAck;
    let lastOutstanding: number | null = null;
    for (;;) {
      if (this.finished.delete(next)) lastOutstanding = next;
      else if (!this.singlyAcked.delete(next)) break;
      this.receivedAt.delete(next++);
    }
    this.nextToAck = next;
    return lastOutstanding;
  }

  /**
   * When the lowest unacked delivery is unfinished and was received at least
   * `stallMs` ago, or is held by another daemon's claim: every finished tag
   * behind it, in order, each to be acked on its own (multiple=false), and
   * from now on counted as acked. Otherwise an empty list (the normal
   * multiple-ack path covers them soon enough).
   */
  takeStalledAcks(stallMs: number, nowMs: number = performance.now()): number[] {
    if (this.finished.size === 0 || this.finished.has(this.nextToAck)) return [];
    if (!this.held.has(this.nextToAck)) {
      const age = this.oldestUnackedAgeMs(nowMs);
      if (age === null || age < stallMs) return [];
    }
    const tags = [...this.finished].sort((a, b) => a - b);
    for (const tag of tags) {
      this.finished.delete(tag);
      this.singlyAcked.add(tag);
      this.receivedAt.delete(tag);
    }
    return tags;
  }

  /** Deliveries received and not yet acked (finished or not). */
  get unacked(): number {
    return this.highestReceived - this.nextToAck + 1 - this.singlyAcked.size;
  }

  /**
   * Age of the oldest delivery not yet acked (finished or not), in ms on the
   * clock `received` was given; null when nothing is unacked. Tags arrive in
   * order and the head is never singly acked, so the oldest is the lowest
   * unacked tag. The one source of the oldest-unacked gauge, the heartbeat's
   * figure and /readyz's stall.
   */
  oldestUnackedAgeMs(nowMs: number = performance.now()): number | null {
    const at = this.receivedAt.get(this.nextToAck);
    return at === undefined ? null : Math.max(0, nowMs - at);
  }

  /** Deliveries received and not yet finished. */
  get inProgress(): number {
    return this.unacked - this.finished.size;
  }
}
