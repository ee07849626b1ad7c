/**
 * Message ids with parts in flight (invariant 4). A second delivery of an id
 * whose first is still being written is not counted on its own: it could
 * race the first past the marker pre-check. It waits on the first and is
 * settled as a duplicate with it; this also covers the redeliveries that
 * follow a reconnect while the original is still being written.
 */
import type { Delivery } from './delivery.js';

export class InFlightMessages {
  private readonly byId = new Map<string, Delivery>();
  /** Without holding copies: the deliveries in flight. */
  private readonly tracked = new Set<Delivery>();

  /**
   * `holdCopies` false (a stream source): nothing waits, every delivery goes
   * on; the watermarks apply each offset once, and a copy read again after a
   * reconnect must not wait on a delivery whose channel is gone and that may
   * never settle. Deliveries are still tracked, for `size`.
   */
  constructor(private readonly holdCopies = true) {}

  /** True when `delivery` is now the one in flight for its id; false when it waits on an earlier one. */
  admit(delivery: Delivery): boolean {
    if (!this.holdCopies) {
      this.tracked.add(delivery);
      return true;
    }
    const first = this.byId.get(delivery.id);
    if (first === undefined) {
      this.byId.set(delivery.id, delivery);
      return true;
    }
    (first.waiters ??= []).push(delivery);
    return false;
  }

  /** Every part of `delivery` is done: a later delivery of its id is counted (or found marked) on its own. */
  release(delivery: Delivery): void {
    if (this.holdCopies) this.byId.delete(delivery.id);
    else this.tracked.delete(delivery);
  }

  /** Messages with parts not yet written. */
  get size(): number {
    return this.holdCopies ? this.byId.size : this.tracked.size;
  }
}
