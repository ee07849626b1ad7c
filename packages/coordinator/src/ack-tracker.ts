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

  /** Records a delivery; tags must arrive in order without gaps. */
  received(tag: number): void {
    if (tag !== this.highestReceived + 1) {
      throw new RangeError(`delivery tag ${tag} out of sequence: expected ${this.highestReceived + 1}`);
    }
    this.highestReceived = tag;
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
    while (this.finished.delete(next)) next++;
    if (next === this.nextToAck) return null;
    this.nextToAck = next;
    return next - 1;
  }

  /** Deliveries received and not yet acked (finished or not). */
  get unacked(): number {
    return this.highestReceived - this.nextToAck + 1;
  }

  /** Deliveries received and not yet finished. */
  get inProgress(): number {
    return this.unacked - this.finished.size;
  }
}
