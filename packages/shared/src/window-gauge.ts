/**
 * The crash window as it happens, shared by the worker threads and the
 * coordinator: per virtual shard, the messages of its batch whose count
 * write has been sent to Redis and whose marker occupation has not. A SIGKILL at
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

  /**
   * Slots 0..V-1: each shard's window. Slots V..2V-1: each shard's settling
   * messages: counts written, marker SETs sent, result not yet taken by the
   * coordinator. A crash then re-counts them only after a recovery slower
   * than the marker TTL (the markers run, then expire), the same as an
   * occupied-but-unacked delivery; until the coordinator has the result they
   * are in neither the window nor its occupied map, and left out they
   * dropped the SET round trip and the reply's trip from U.
   */
  static create(virtualShards: number): WindowGauge {
    return new WindowGauge(new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT * virtualShards * 2));
  }

  private get shards(): number {
    return this.slots.length / 2;
  }

  /** The shard's count write is about to be sent: `messages` are inside the window. */
  open(vshard: number, messages: number): void {
    Atomics.store(this.slots, vshard, Math.round(messages * SCALE));
  }

  /**
   * The shard's marker SETs are about to be sent: its window is closed, and
   * its messages settle until the coordinator takes the batch's result.
   */
  close(vshard: number): void {
    const open = Atomics.load(this.slots, vshard);
    if (open > 0) Atomics.store(this.slots, this.shards + vshard, open);
    Atomics.store(this.slots, vshard, 0);
  }

  /** The coordinator has the shard's batch result (or its failure): nothing of it settles any more. */
  settled(vshard: number): void {
    Atomics.store(this.slots, this.shards + vshard, 0);
  }

  /** Messages inside a window right now, over all shards. */
  messages(): number {
    return this.sum(0);
  }

  /** Messages settling right now (markers sent, result not yet taken), over all shards. */
  settling(): number {
    return this.sum(this.shards);
  }

  private sum(from: number): number {
    let sum = 0;
    for (let slot = from; slot < from + this.shards; slot++) sum += Atomics.load(this.slots, slot);
    return sum / SCALE;
  }
}
