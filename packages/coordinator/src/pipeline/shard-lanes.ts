/**
 * One lane per virtual shard: parts wait here until their batch flushes.
 *
 * A lane flushes at `batchSize` parts or `batchMaxChanges` changes
 * (TALLY_BATCH_MAX_CHANGES, so no script holds Redis long), when its oldest part has waited
 * `batchWaitMs`, or when asked to (prefetch credit exhausted, shutdown).
 * A lane has at most one batch in flight. That bounds the crash window: a
 * crash costs at most one batch per shard. (Two batches of one shard could
 * not race each other past a marker anyway: the daemon holds back a second
 * delivery of an id in flight until the first is done.)
 */
import type { PartChanges } from '@tally/shared';
import type { Delivery } from './delivery.js';

export interface PendingPart {
  readonly delivery: Delivery;
  readonly changes: PartChanges;
}

export interface LaneOptions {
  readonly virtualShards: number;
  readonly batchSize: number;
  /**
   * A batch takes parts while their changes stay within this (one part at
   * least, however many changes it has: a part is never split). A hostile
   * producer aiming every SKU at one shard otherwise makes one script carry
   * batchSize × 10,000 changes and block Redis for seconds.
   */
  readonly batchMaxChanges: number;
  readonly batchWaitMs: number;
}

/** Runs one batch to completion; never rejects (retries are the dispatcher's job). */
export type DispatchBatch = (vshard: number, parts: PendingPart[]) => Promise<void>;

interface Lane {
  pending: PendingPart[];
  /** When each pending part arrived, parallel to `pending`. */
  arrivedAt: number[];
  /** Changes of the pending parts, summed. */
  pendingChanges: number;
  /** A batch of this lane is in flight. */
  busy: boolean;
  /** flushAll() was called: keep flushing, without waiting, until the lane is empty. */
  drainRequested: boolean;
  timer: NodeJS.Timeout | null;
}

export class ShardLanes {
  private readonly lanes: Lane[];
  private busyLanes = 0;
  private pendingParts = 0;
  private idleWaiters: Array<() => void> = [];
  /** Parts put back by hold(), waiting for their timer; counted in pendingParts meanwhile. */
  private readonly heldTimers = new Set<NodeJS.Timeout>();

  constructor(
    private readonly options: LaneOptions,
    private readonly dispatch: DispatchBatch,
  ) {
    this.lanes = Array.from({ length: options.virtualShards }, () => ({
      pending: [],
      arrivedAt: [],
      pendingChanges: 0,
      busy: false,
      drainRequested: false,
      timer: null,
    }));
  }

  add(vshard: number, part: PendingPart): void {
    const lane = this.lanes[vshard]!;
    lane.pending.push(part);
    lane.arrivedAt.push(performance.now());
    lane.pendingChanges += part.changes.length;
    this.pendingParts++;
    if (this.full(lane)) this.flush(vshard);
    else this.arm(vshard);
  }

  /**
   * Puts a part back into its lane after `delayMs`: another daemon's claim
   * held it (two-step). It counts as pending meanwhile, so whenIdle() waits
   * for it and a drain does not mistake it for finished.
   */
  hold(vshard: number, part: PendingPart, delayMs: number): void {
    this.pendingParts++;
    const timer = setTimeout(() => {
      this.heldTimers.delete(timer);
      const lane = this.lanes[vshard]!;
      lane.pending.push(part);
      lane.arrivedAt.push(performance.now());
      if (lane.pending.length >= this.options.batchSize) this.flush(vshard);
      else this.arm(vshard);
    }, delayMs);
    this.heldTimers.add(timer);
  }

  /** Flushes every lane that has parts waiting. */
  flushAll(): void {
    for (let vshard = 0; vshard < this.lanes.length; vshard++) {
      const lane = this.lanes[vshard]!;
      if (lane.pending.length === 0) continue;
      lane.drainRequested = true;
      this.flush(vshard);
    }
  }

  /** Parts waiting plus lanes with a batch in flight; 0 means fully drained. */
  get load(): { pendingParts: number; busyLanes: number } {
    return { pendingParts: this.pendingParts, busyLanes: this.busyLanes };
  }

  /** Per-lane waiting parts, for the per-shard queue depth gauge. */
  depths(): number[] {
    return this.lanes.map((lane) => lane.pending.length);
  }

  /** Resolves once no part waits and no batch is in flight. */
  whenIdle(): Promise<void> {
    if (this.pendingParts === 0 && this.busyLanes === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Clears timers; parts still waiting or held are abandoned (their deliveries stay unacked). */
  close(): void {
    for (const timer of this.heldTimers) clearTimeout(timer);
    this.heldTimers.clear();
    for (const lane of this.lanes) {
      if (lane.timer) clearTimeout(lane.timer);
      lane.timer = null;
    }
  }

  /** A full batch is waiting: batchSize parts, or batchMaxChanges changes. */
  private full(lane: Lane): boolean {
    return lane.pending.length >= this.options.batchSize || lane.pendingChanges >= this.options.batchMaxChanges;
  }

  /** How many of the lane's first parts make the next batch: up to batchSize, within batchMaxChanges, one at least. */
  private batchLength(lane: Lane): number {
    const { batchSize, batchMaxChanges } = this.options;
    let changes = lane.pending[0]!.changes.length;
    let length = 1;
    while (length < lane.pending.length && length < batchSize) {
      const next = lane.pending[length]!.changes.length;
      if (changes + next > batchMaxChanges) break;
      changes += next;
      length++;
    }
    return length;
  }

  private arm(vshard: number): void {
    const lane = this.lanes[vshard]!;
    if (lane.timer !== null || lane.busy || lane.pending.length === 0) return;
    const waited = performance.now() - lane.arrivedAt[0]!;
    const delay = Math.max(0, this.options.batchWaitMs - waited);
    lane.timer = setTimeout(() => {
      lane.timer = null;
      this.flush(vshard);
    }, delay);
  }

  private flush(vshard: number): void {
    const lane = this.lanes[vshard]!;
    if (lane.busy || lane.pending.length === 0) return;
    if (lane.timer) {
      clearTimeout(lane.timer);
      lane.timer = null;
    }
    const size = this.batchLength(lane);
    const parts = lane.pending.length <= size ? lane.pending : lane.pending.slice(0, size);
    lane.pending = parts === lane.pending ? [] : lane.pending.slice(size);
    lane.arrivedAt = lane.pending.length === 0 ? [] : lane.arrivedAt.slice(size);
    for (const part of parts) lane.pendingChanges -= part.changes.length;
    if (lane.pending.length === 0) lane.drainRequested = false;
    this.pendingParts -= parts.length;
    lane.busy = true;
    this.busyLanes++;
    void this.dispatch(vshard, parts).finally(() => {
      lane.busy = false;
      this.busyLanes--;
      const due = lane.pending.length > 0 && (lane.drainRequested || this.full(lane) || performance.now() - lane.arrivedAt[0]! >= this.options.batchWaitMs);
      if (due) this.flush(vshard);
      else this.arm(vshard);
      if (this.pendingParts === 0 && this.busyLanes === 0) {
        const waiters = this.idleWaiters;
        this.idleWaiters = [];
        for (const resolve of waiters) resolve();
      }
    });
  }
}
