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

  /** True when `delivery` is now the one in flight for its id; false when it waits on an earlier one. */
  admit(delivery: Delivery): boolean {
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
    this.byId.delete(delivery.id);
  }

  /** Messages with parts not yet written. */
  get size(): number {
    return this.byId.size;
  }
}
