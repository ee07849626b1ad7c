/**
 * Where a daemon starts reading a partition it takes, from its committed
 * checkpoint and what the stream holds now (its first and last offsets).
 * Pure: the stream source probes, reads the checkpoint and follows the plan.
 *
 * Never from the lowest watermark: a shard that receives nothing would hold
 * that back forever. The checkpoint is where every shard is known applied.
 * Counting resumes after it; with TALLY_STREAM_DEDUP the reading starts
 * earlier, at the checkpoint's time minus the window, so the id window is
 * rebuilt from the log before the first message is counted.
 *
 * What the stream holds can contradict the checkpoint:
 * - it ends before the checkpoint, or is empty: it was deleted and
 *   recreated (offsets restart at 0). Counting it from the checkpoint would
 *   skip everything below: refused, with the fix named;
 * - its first offset is past the checkpoint: retention deleted what was not
 *   yet counted. Those messages are gone whatever Tally does: the gap is
 *   counted and alerted, and counting goes on from the first offset left;
 * - the checkpointed offset holds another message: recreated, refused (the
 *   cursor finds that when it reads it, stream-cursor.ts).
 */
import type { CheckpointRecord } from './checkpoint-record.js';

/** The stream's first and last offsets now; null for an empty stream. */
export interface StreamBounds {
  readonly first: number;
  readonly last: number;
}

/** Where the consumer starts: an offset, the stream's start, or a time (the chunk holding it). */
export type StartAt = { readonly kind: 'offset'; readonly offset: number } | { readonly kind: 'first' } | { readonly kind: 'time'; readonly epochMs: number };

export type ResumePlan =
  | {
      readonly kind: 'read';
      readonly startAt: StartAt;
      /** Offsets below this go to the id window only. */
      readonly countFrom: number;
      /** The first offset delivered must be at most this, or the start overshot (a time start on a skewed clock): start again at this offset. */
      readonly mustSee: number | null;
      /** The checkpointed message to find on the way (its body), or null. */
      readonly confirm: { readonly offset: number; readonly body: string } | null;
      /** Offsets the stream lost before they were counted (retention): 0 normally. */
      readonly lostOffsets: number;
      readonly why: string;
    }
  | { readonly kind: 'refuse'; readonly reason: string };

export interface ResumeInputs {
  readonly checkpoint: CheckpointRecord | null;
  /** null: the stream is empty. */
  readonly bounds: StreamBounds | null;
  /** TALLY_STREAM_DEDUP on: the window to rebuild, in ms (TALLY_MARKER_TTL_S); 0 when off. */
  readonly windowMs: number;
}

export function planResume({ checkpoint, bounds, windowMs }: ResumeInputs): ResumePlan {
  if (checkpoint === null || checkpoint.offset < 0) {
    // A new partition (or one rewound to before its first message): the whole stream counts.
    return {
      kind: 'read',
      startAt: { kind: 'first' },
      countFrom: 0,
      mustSee: null,
      confirm: null,
      lostOffsets: 0,
      why: checkpoint === null ? 'no checkpoint' : 'rewound to the start',
    };
  }
  const at = checkpoint.offset;
  if (bounds === null) return { kind: 'refuse', reason: `the stream is empty, yet its checkpoint is at offset ${at}: it was deleted and recreated` };
  if (bounds.last < at)
    return { kind: 'refuse', reason: `the stream ends at offset ${bounds.last}, before its checkpoint at offset ${at}: it was deleted and recreated` };
  if (bounds.first > at + 1) {
    return {
      kind: 'read',
      startAt: { kind: 'offset', offset: bounds.first },
      countFrom: bounds.first,
      mustSee: null,
      confirm: null,
      lostOffsets: bounds.first - at - 1,
      why: `retention deleted offsets ${at + 1} to ${bounds.first - 1} before they were counted`,
    };
  }
  // The checkpointed message itself may be gone (retention) while the next one is the first left: nothing lost, nothing to confirm.
  const confirm = checkpoint.body !== '' && bounds.first <= at ? { offset: at, body: checkpoint.body } : null;
  const firstToRead = confirm === null ? at + 1 : at;
  const startAt: StartAt = windowMs > 0 ? { kind: 'time', epochMs: checkpoint.at - windowMs } : { kind: 'offset', offset: firstToRead };
  return {
    kind: 'read',
    startAt,
    countFrom: at + 1,
    mustSee: startAt.kind === 'time' ? firstToRead : null,
    confirm,
    lostOffsets: 0,
    why: windowMs > 0 ? 'checkpoint, id window rebuilt from the log' : 'checkpoint',
  };
}
