/** Exponential backoff with full jitter, capped. Pure: callers do the waiting. */
export interface BackoffOptions {
  readonly baseMs: number;
  readonly capMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = Object.freeze({ baseMs: 100, capMs: 5_000 });

export function backoffDelay(attempt: number, options: BackoffOptions = DEFAULT_BACKOFF, random: () => number = Math.random): number {
  const ceiling = Math.min(options.capMs, options.baseMs * 2 ** Math.min(attempt, 20));
  // Half fixed, half jitter: never zero, and daemons that fail together spread out.
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}
