/**
 * What one subscription to a partition's stream does with each offset it
 * reads, decided where the subscription started (stream-source.ts):
 *
 * - `window`: before the offset counting resumes from: read into the id
 *   window only (its rebuild, or a chunk's earlier messages the broker
 *   delivers first), never counted;
 * - `skip`: nothing to do (the partition was refused);
 * - `count`: through the pipeline, where the watermarks decide.
 *
 * A resume from a checkpoint checks the stream's identity on the way: the
 * checkpointed offset must hold the very message committed there (its body
 * hash). Another body there, or no message at that offset while later ones
 * come, means the stream was deleted and recreated: counting it from the
 * checkpoint would skip everything below it, so the partition is refused
 * (`onMismatch`) and everything after is skipped.
 */
import { createHash } from 'node:crypto';
import type { IdWindowLike } from './stream-state.js';

export type CursorVerdict = 'count' | 'window' | 'skip';

export interface StreamCursor {
  readonly partition: number;
  /** The partition's id window (TALLY_STREAM_DEDUP), null when off. */
  readonly window: IdWindowLike | null;
  /** False once the stream was found not to be the one checkpointed, or the start overshot: nothing read since may be committed. */
  readonly trusted: boolean;
  classify(offset: number, body: Buffer): CursorVerdict;
}

/** The hex SHA-256 prefix a checkpoint keeps of its message's body (checkpoint-record.ts `body`). */
export function bodyHash(body: Buffer): string {
  return createHash('sha256').update(body).digest('hex').slice(0, 32);
}

/** Where counting starts, and what must be found on the way (resume-plan.ts). */
export interface CursorStart {
  readonly partition: number;
  /** Offsets below this are read into the window only. */
  readonly countFrom: number;
  /** The checkpoint to confirm on the way: its offset (below countFrom) must hold this body. */
  readonly confirm: { readonly offset: number; readonly body: string } | null;
  /** The first offset delivered must be at most this (a start by time that overshot it is started again by offset); null: no check. */
  readonly mustSee: number | null;
}

export interface CursorEvents {
  /** The stream is not the one the checkpoint was taken on: refuse the partition (called once). */
  onMismatch(detail: string): void;
  /**
   * Offsets jumped while reading: retention deleted them under a reader
   * that fell behind (`after` and `next` read one after the other). Never
   * silent: the source counts and alerts it.
   */
  onGap(after: number, next: number): void;
  /** A start by time began past `mustSee` (the clocks disagree): read again from `mustSee` by offset (called once). */
  onOvershoot(firstOffset: number): void;
}

export class ResumeCursor implements StreamCursor {
  private confirmed: boolean;
  private seenAny = false;
  /** The offset read last; a jump of more than one segment boundary from it is a gap. */
  private last = -1;
  private stopped = false;

  constructor(
    private readonly start: CursorStart,
    readonly window: IdWindowLike | null,
    private readonly events: CursorEvents,
  ) {
    this.confirmed = start.confirm === null;
  }

  get partition(): number {
    return this.start.partition;
  }

  get trusted(): boolean {
    return !this.stopped;
  }

  classify(offset: number, body: Buffer): CursorVerdict {
    if (this.stopped) return 'skip';
    const { confirm, countFrom, mustSee } = this.start;
    if (!this.seenAny) {
      this.seenAny = true;
      if (mustSee !== null && offset > mustSee) {
        this.stopped = true;
        this.events.onOvershoot(offset);
        return 'skip';
      }
    }
    if (!this.confirmed && confirm !== null) {
      if (offset === confirm.offset) {
        const found = bodyHash(body);
        if (found !== confirm.body)
          return this.mismatch(`offset ${offset} holds another message than the one checkpointed there (body ${found}, checkpointed ${confirm.body})`);
        this.confirmed = true;
      } else if (offset > confirm.offset) {
        return this.mismatch(`offset ${confirm.offset}, checkpointed, was not delivered: the stream went from below it to ${offset}`);
      }
    }
    // A segment boundary uses one offset: consecutive deliveries are at most 2 apart unless something was deleted
    // between them. Only what was still to count is lost: a jump below the resume point costs the id window only.
    const before = Math.max(this.last, countFrom - 1);
    if (this.last >= 0 && offset >= countFrom && offset > before + 2) this.events.onGap(before, offset);
    this.last = offset;
    return offset < countFrom ? 'window' : 'count';
  }

  private mismatch(detail: string): CursorVerdict {
    this.stopped = true;
    this.events.onMismatch(detail);
    return 'skip';
  }
}
