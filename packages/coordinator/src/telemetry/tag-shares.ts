/**
 * One channel's occupied share (in messages) of each unacked delivery tag,
 * for the exposure meter. Pure.
 *
 * Tag t sits at slot `t & (capacity - 1)` of a Float64Array, for the tags
 * above `ackedThrough`: a typed array over the prefetch window, not a Map
 * entry per delivery, whose entries were part of the main thread's garbage
 * per delivery (4.3 → 2.8 KB per delivery with the other changes of that
 * commit, docs/benchmark.md). It doubles when a tag falls past it: single
 * acks behind a stalled head let the unacked range outgrow the window.
 */
export class TagShares {
  private shares = new Float64Array(4096);
  /** Tags with a share. */
  private occupied = 0;
  /** Every tag up to this one is acked (multiple-ack). */
  private ackedThrough = 0;

  /** Tags with a share. */
  get size(): number {
    return this.occupied;
  }

  /** Adds `share` to `tag`; false (nothing added) when the tag is acked already. */
  add(tag: number, share: number): boolean {
    if (tag <= this.ackedThrough || !(share > 0)) return false;
    while (tag - this.ackedThrough > this.shares.length) this.grow();
    const slot = tag & (this.shares.length - 1);
    if (this.shares[slot] === 0) this.occupied++;
    this.shares[slot] = this.shares[slot]! + share;
    return true;
  }

  /** Every tag up to `upTo` is acked: their shares, summed, are taken out. */
  ackThrough(upTo: number): number {
    let taken = 0;
    const last = Math.min(upTo, this.ackedThrough + this.shares.length);
    for (let tag = this.ackedThrough + 1; tag <= last && this.occupied > 0; tag++) taken += this.take(tag);
    this.ackedThrough = Math.max(this.ackedThrough, upTo);
    return taken;
  }

  /** One tag above the contiguous run is acked on its own: its share is taken out. */
  ackOne(tag: number): number {
    if (tag <= this.ackedThrough || tag - this.ackedThrough > this.shares.length) return 0;
    return this.take(tag);
  }

  /** The shares of every unacked tag, summed. */
  total(): number {
    let sum = 0;
    for (let slot = 0; slot < this.shares.length && this.occupied > 0; slot++) sum += this.shares[slot]!;
    return sum;
  }

  private take(tag: number): number {
    const slot = tag & (this.shares.length - 1);
    const share = this.shares[slot]!;
    if (share === 0) return 0;
    this.shares[slot] = 0;
    this.occupied--;
    return share;
  }

  /** Twice the slots, each unacked tag's share moved to its new slot. */
  private grow(): void {
    const old = this.shares;
    const next = new Float64Array(old.length * 2);
    for (let tag = this.ackedThrough + 1; tag <= this.ackedThrough + old.length; tag++) next[tag & (next.length - 1)] = old[tag & (old.length - 1)]!;
    this.shares = next;
  }
}
