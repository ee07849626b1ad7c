/**
 * What a stream daemon knows of each partition it has read: the watermarks
 * it has seen per virtual shard (batches carry them as `expected`, so one
 * found lower reveals writes Redis lost), and the partition's id window.
 * Shared by the pipeline, which moves the watermarks as batches return, and
 * the stream source, which resumes, checkpoints and rewinds partitions.
 *
 * A partition's state outlives its subscriptions: a reconnect or a rewind
 * keeps what was seen (the watermarks only move forward unless a rollback
 * resets one to what Redis holds); a handover to another daemon drops it.
 */
import type { DigestText } from '@tally/shared';
import type { StreamLog } from '../pipeline/ports.js';

/** The id window as the stream side uses it (shared/src/id-window.ts). */
export interface IdWindowLike {
  admit(digest: Uint8Array | DigestText, offset: number, nowMs: number): 'new' | 'same' | 'duplicate';
  expire(nowMs: number): void;
  readonly size: number;
}

export interface PartitionState {
  /** Per virtual shard, the watermark last seen (-1: none). */
  readonly known: Float64Array;
  readonly window: IdWindowLike | null;
}

export interface StreamStateOptions {
  readonly virtualShards: number;
  /** A new id window (TALLY_STREAM_DEDUP), or null when duplicates are not looked for. */
  newWindow(): IdWindowLike | null;
  /** A batch found (partition, shard)'s watermark below what was seen: the source replays the partition from `found` + 1. */
  onRollback(partition: number, vshard: number, found: number, expected: number): void;
}

export class StreamState implements StreamLog {
  private readonly partitions = new Map<number, PartitionState>();

  constructor(private readonly options: StreamStateOptions) {}

  /** The partition's state, made on first use. */
  of(partition: number): PartitionState {
    let state = this.partitions.get(partition);
    if (state === undefined) {
      state = { known: new Float64Array(this.options.virtualShards).fill(-1), window: this.options.newWindow() };
      this.partitions.set(partition, state);
    }
    return state;
  }

  /** The partition is no longer this daemon's (handed over): what it knew goes; a later takeover resumes from the checkpoint. */
  forget(partition: number): void {
    this.partitions.delete(partition);
  }

  /** At a resume: the watermarks the checkpoint vouches for become the floor expected of every shard. */
  expectAtLeast(partition: number, known: readonly number[]): void {
    const state = this.of(partition).known;
    for (let s = 0; s < state.length && s < known.length; s++) if (known[s]! > state[s]!) state[s] = known[s]!;
  }

  expected(partition: number, vshard: number): number {
    return this.partitions.get(partition)?.known[vshard] ?? -1;
  }

  applied(partition: number, vshard: number, watermark: number): void {
    const known = this.of(partition).known;
    if (watermark > known[vshard]!) known[vshard] = watermark;
  }

  rolledBack(partition: number, vshard: number, found: number, expected: number): void {
    // What Redis holds now is the truth the replay starts from.
    this.of(partition).known[vshard] = found;
    this.options.onRollback(partition, vshard, found, expected);
  }

  /** The watermarks seen for a partition, per shard: what a checkpoint records. */
  knownOf(partition: number): number[] {
    return Array.from(this.partitions.get(partition)?.known ?? new Float64Array(this.options.virtualShards).fill(-1));
  }
}
