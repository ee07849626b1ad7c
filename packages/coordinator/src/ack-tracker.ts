/**
 * Exact acks for one channel (invariant 7). Shards finish out of order; a
 * multiple-ack may cover only a contiguous run of finished delivery tags,
 * and a tag acked twice closes the channel (PRECONDITION_FAILED). Pure: the
 * caller sends the ack this returns.
 *
 * RabbitMQ numbers deliveries on a channel 1, 2, 3, … with no gaps, so
 * "every tag below N is finished" is a single integer.
 */
export class AckTracker {
  /** Lowest tag not yet acked. */
  private nextToAck = 1;
  private highestReceived = 0;
  private readonly finished = new Set<number>();
  /** When each unacked tag was received (ms, caller's clock): the oldest unacked age is the lowest tag's. */
  private readonly receivedAt = new Map<number, number>();

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
    if (tag < this.nextToAck || tag > this.highestReceived || this.finished.has(tag)) {
      throw new RangeError(`delivery tag ${tag} finished twice or never received`);
    }
    this.finished.add(tag);
  }

  /**
   * The tag to ack with multiple=true, covering every tag up to it, or null
   * when the lowest unacked delivery is still in progress.
   */
  takeAckable(): number | null {
    let next = this.nextToAck;
    while (this.finished.delete(next)) this.receivedAt.delete(next++);
    if (next === this.nextToAck) return null;
    this.nextToAck = next;
    return next - 1;
  }

  /** Deliveries received and not yet acked (finished or not). */
  get unacked(): number {
    return this.highestReceived - this.nextToAck + 1;
  }

  /**
   * Age of the oldest delivery not yet acked (finished or not), in ms on the
   * clock `received` was given; null when nothing is unacked. Tags arrive in
   * order, so the oldest is the lowest unacked tag.
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
