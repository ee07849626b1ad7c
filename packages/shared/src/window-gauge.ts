/**
 * The crash window as it happens, shared by the worker threads and the
 * coordinator: per virtual shard, the messages of its batch whose count
 * write has been sent to Redis and whose marker SETs have not. A SIGKILL at
 * that moment re-counts exactly those (the sent write still runs, the unsent
 * SETs never do).
 *
 * It lives in a SharedArrayBuffer handed to the threads as workerData. A
 * thread writes only the slots of the shards it owns (one batch per shard at
 * a time); the coordinator's exposure meter reads the sum when it samples.
 * Measured this way, a window that is still open when the daemon is killed
 * has been counted up to the last sample, whereas a figure reported with the
 * batch's result would be lost with the batch, and a daemon killed every
 * second or two (a crash loop) would report only a fraction of its exposure.
 */

/** Slots hold messages in ten-thousandths (a part is 1/parts of its message; Atomics needs integers). */
const SCALE = 10_000;

export class WindowGauge {
  private readonly slots: Int32Array;

  constructor(readonly buffer: SharedArrayBuffer) {
    this.slots = new Int32Array(buffer);
  }

  static create(virtualShards: number): WindowGauge {
    return new WindowGauge(new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT * virtualShards));
  }

  /** The shard's count write is about to be sent: `messages` are inside the window. */
  open(vshard: number, messages: number): void {
    Atomics.store(this.slots, vshard, Math.round(messages * SCALE));
  }

  /** The shard's marker SETs are about to be sent: its window is closed. */
  close(vshard: number): void {
    Atomics.store(this.slots, vshard, 0);
  }

  /** Messages inside a window right now, over all shards. */
  messages(): number {
    let sum = 0;
    for (let vshard = 0; vshard < this.slots.length; vshard++) sum += Atomics.load(this.slots, vshard);
    return sum / SCALE;
  }
}
