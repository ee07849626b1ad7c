import { publishAll, type Publish } from '@tally/workload';
import { AMQP_URL } from '../test/integration/harness.js';

/**
 * The workload published in order, in slices, as the victims consume it:
 * publishing a whole run's backlog up front took over a minute (the SIGKILL
 * scenario's), and a backlog that large had to be sized for the fastest
 * machine. Scenarios top it up while no victim runs. A slice is
 * confirmed before the next ready count is read, so `published - ready`
 * (what the ledger takes as delivered) stays exact.
 */
export class Backlog {
  published = 0;
  publishMs = 0;

  constructor(
    private readonly publishes: readonly Publish[],
    private readonly queue: string,
  ) {}

  /** Publishes the next messages until `ready` would reach `target`. */
  async topUp(ready: number, target: number): Promise<void> {
    const count = Math.min(Math.max(0, target - ready), this.publishes.length - this.published);
    if (count === 0) return;
    const started = performance.now();
    await publishAll(this.publishes.slice(this.published, this.published + count), { url: AMQP_URL, queue: this.queue });
    this.published += count;
    this.publishMs += performance.now() - started;
  }

  get exhausted(): boolean {
    return this.published === this.publishes.length;
  }
}
