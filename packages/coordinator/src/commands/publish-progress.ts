/**
 * The progress line `tally publish` keeps on stderr, for a person watching a
 * terminal: nothing for runs shorter than a few seconds, nothing when stderr
 * is not a TTY (pipes and CI logs get the one JSON summary on stdout only).
 */
export interface ProgressOptions {
  /** Nothing is shown before the run is this old. */
  readonly delayMs: number;
  /** At most one redraw per this many milliseconds. */
  readonly everyMs: number;
}

export const PROGRESS_DEFAULTS: ProgressOptions = Object.freeze({ delayMs: 2_000, everyMs: 250 });

export function progressLine(done: number, total: number, elapsedMs: number): string {
  const rate = elapsedMs > 0 ? (done * 1000) / elapsedMs : 0;
  const percent = total > 0 ? Math.floor((done * 100) / total) : 100;
  const left = rate > 0 ? Math.ceil((total - done) / rate) : undefined;
  return `published ${done.toLocaleString('en-US')} of ${total.toLocaleString('en-US')} (${percent}%), ${Math.round(rate).toLocaleString('en-US')} msg/s${left !== undefined && done < total ? `, about ${left} s left` : ''}`;
}

export class PublishProgress {
  private readonly started: number;
  private lastDraw = -Infinity;
  private shown = false;

  constructor(
    private readonly total: number,
    private readonly write: (text: string) => void,
    private readonly now: () => number = () => performance.now(),
    private readonly options: ProgressOptions = PROGRESS_DEFAULTS,
  ) {
    this.started = now();
  }

  update(done: number): void {
    const t = this.now();
    if (t - this.started < this.options.delayMs || t - this.lastDraw < this.options.everyMs) return;
    this.lastDraw = t;
    this.shown = true;
    // \r and erase-line: one line redrawn in place.
    this.write(`\r\x1b[K${progressLine(done, this.total, t - this.started)}`);
  }

  /** Clears the line, so the summary that follows starts clean. */
  finish(): void {
    if (this.shown) this.write('\r\x1b[K');
  }
}
