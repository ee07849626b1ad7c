/**
 * The one retry loop: run a step until it succeeds, waiting a backoff delay
 * (backoff.ts) between attempts. Every retrying call site of Tally goes
 * through it, so "outages wait, they do not drop" (invariant 8) is written
 * once, and so is the point where a failure's class (failure-class.ts)
 * decides between waiting and giving up.
 *
 * Waiting and randomness are injectable, so tests run it on a fake clock.
 */
import { setTimeout as nodeSleep } from 'node:timers/promises';
import { backoffDelay, DEFAULT_BACKOFF, type BackoffOptions } from './backoff.js';
import { classifyError, type FailureClass } from './failure-class.js';

/** One failed attempt, as reported to `onAttemptFailed` before the wait. */
export interface FailedAttempt {
  readonly error: unknown;
  /** 0 for the first attempt. */
  readonly attempt: number;
  readonly failureClass: FailureClass;
  /** How long the loop waits before the next attempt. */
  readonly delayMs: number;
}

export interface RetryOptions {
  /** How a failure is classified; classifyError by default. */
  readonly classify?: (error: unknown) => FailureClass;
  /**
   * Failures for which this returns true are rethrown at once instead of
   * retried. By default nothing is: every failure waits and retries, except
   * a `bug`, which is always rethrown at once whatever this says (a
   * programming error is not an outage; invariant 13).
   * This is where a caller gives up on a `fatal` start-up refusal or hands a
   * `data` refusal to dead-lettering.
   */
  readonly giveUp?: (failureClass: FailureClass, error: unknown) => boolean;
  /** Called for each failure that will be retried: log it, count it, mark the span. */
  readonly onAttemptFailed?: (failure: FailedAttempt) => void;
  /**
   * Checked before every attempt and before every wait: once it returns
   * true the loop ends with RETRY_STOPPED (the work was abandoned on
   * purpose: the channel it belonged to is gone, the daemon is stopping).
   */
  readonly stopWhen?: () => boolean;
  readonly backoff?: BackoffOptions;
  readonly sleep?: (ms: number) => Promise<unknown>;
  readonly random?: () => number;
}

/** What retryUntilDone resolves to when `stopWhen` ended it before the step succeeded. */
export const RETRY_STOPPED: unique symbol = Symbol('retry stopped');

export function retryUntilDone<T>(
  step: (attempt: number) => Promise<T>,
  options: RetryOptions & { stopWhen: () => boolean },
): Promise<T | typeof RETRY_STOPPED>;
export function retryUntilDone<T>(step: (attempt: number) => Promise<T>, options?: RetryOptions): Promise<T>;
export async function retryUntilDone<T>(step: (attempt: number) => Promise<T>, options: RetryOptions = {}): Promise<T | typeof RETRY_STOPPED> {
  const { classify = classifyError, giveUp, onAttemptFailed, stopWhen, backoff = DEFAULT_BACKOFF, sleep = nodeSleep, random = Math.random } = options;
  for (let attempt = 0; ; attempt++) {
    if (stopWhen?.()) return RETRY_STOPPED;
    try {
      return await step(attempt);
    } catch (error) {
      const failureClass = classify(error);
      if (failureClass === 'bug' || giveUp?.(failureClass, error)) throw error;
      if (stopWhen?.()) return RETRY_STOPPED;
      const delayMs = backoffDelay(attempt, backoff, random);
      onAttemptFailed?.({ error, attempt, failureClass, delayMs });
      await sleep(delayMs);
    }
  }
}
