import { expect } from 'chai';
import { backoffDelay, DEFAULT_BACKOFF } from '../src/backoff.js';
import type { FailureClass } from '../src/failure-class.js';
import { retryUntilDone, RETRY_STOPPED, type FailedAttempt } from '../src/retry.js';

/** A fake clock: sleeping records the delay and advances time at once. */
function fakeClock() {
  const slept: number[] = [];
  return {
    slept,
    now: () => slept.reduce((a, b) => a + b, 0),
    sleep: async (ms: number) => {
      slept.push(ms);
    },
  };
}

function replyError(message: string): Error {
  const error = new Error(message);
  error.name = 'ReplyError';
  return error;
}

/** A step that fails with the given errors in turn, then returns `value`. */
function failing<T>(errors: unknown[], value: T): { step: (attempt: number) => Promise<T>; attempts: number[] } {
  const attempts: number[] = [];
  return {
    attempts,
    step: async (attempt) => {
      attempts.push(attempt);
      const error = errors[attempts.length - 1];
      if (error !== undefined) throw error;
      return value;
    },
  };
}

describe('retryUntilDone', () => {
  it('returns the first success without waiting', async () => {
    const clock = fakeClock();
    const { step, attempts } = failing([], 'done');
    expect(await retryUntilDone(step, { sleep: clock.sleep })).to.equal('done');
    expect(attempts).to.deep.equal([0]);
    expect(clock.slept).to.deep.equal([]);
  });

  it('retries every failure by default, waiting the backoff delay of each attempt', async () => {
    const clock = fakeClock();
    const errors = [new Error('Connection is closed.'), replyError('LOADING'), replyError('NOPERM'), replyError('WRONGTYPE x')];
    const { step, attempts } = failing(errors, 7);
    const failures: FailedAttempt[] = [];
    const value = await retryUntilDone(step, { sleep: clock.sleep, random: () => 0, onAttemptFailed: (f) => failures.push(f) });
    expect(value).to.equal(7);
    expect(attempts).to.deep.equal([0, 1, 2, 3, 4]);
    // random 0: half the ceiling, 50, 100, 200, 400 ms with the default backoff.
    expect(clock.slept).to.deep.equal([50, 100, 200, 400]);
    expect(clock.now()).to.equal(750);
    expect(failures.map((f) => [f.attempt, f.failureClass, f.delayMs])).to.deep.equal([
      [0, 'transient', 50],
      [1, 'transient', 100],
      [2, 'fatal', 200],
      [3, 'data', 400],
    ]);
    expect(failures.map((f) => f.error)).to.deep.equal(errors);
  });

  it('waits what backoffDelay says for the given options and randomness, capped', async () => {
    const clock = fakeClock();
    const backoff = { baseMs: 10, capMs: 35 };
    const { step } = failing(
      Array.from({ length: 6 }, () => new Error('down')),
      'up',
    );
    await retryUntilDone(step, { sleep: clock.sleep, backoff, random: () => 0.5 });
    expect(clock.slept).to.deep.equal([0, 1, 2, 3, 4, 5].map((attempt) => backoffDelay(attempt, backoff, () => 0.5)));
    expect(clock.slept).to.deep.equal([8, 15, 26, 26, 26, 26]);
  });

  it('uses the default backoff when none is given', async () => {
    const clock = fakeClock();
    const { step } = failing([new Error('down'), new Error('down')], 'up');
    await retryUntilDone(step, { sleep: clock.sleep, random: () => 1 - Number.EPSILON });
    expect(clock.slept).to.deep.equal([DEFAULT_BACKOFF.baseMs, 2 * DEFAULT_BACKOFF.baseMs]);
  });

  it('rethrows at once a failure the caller gives up on, with no wait and no report', async () => {
    const clock = fakeClock();
    const fatal = replyError('NOPERM no permission');
    const { step, attempts } = failing([new Error('Connection is closed.'), fatal], 'never');
    const seen: Array<[FailureClass, unknown]> = [];
    const failures: FailedAttempt[] = [];
    const run = retryUntilDone(step, {
      sleep: clock.sleep,
      random: () => 0,
      giveUp: (failureClass, error) => {
        seen.push([failureClass, error]);
        return failureClass === 'fatal';
      },
      onAttemptFailed: (f) => failures.push(f),
    });
    let thrown: unknown;
    await run.catch((error: unknown) => {
      thrown = error;
    });
    expect(thrown).to.equal(fatal);
    expect(attempts).to.deep.equal([0, 1]);
    expect(seen.map(([c]) => c)).to.deep.equal(['transient', 'fatal']);
    expect(clock.slept).to.deep.equal([50]);
    expect(failures).to.have.length(1);
  });

  it('never retries a bug, whatever giveUp says: rethrown at once, no wait, no report', async () => {
    for (const bug of [new TypeError("Cannot read properties of undefined (reading 'marked')"), new RangeError('delivery tag 7 out of sequence')]) {
      const clock = fakeClock();
      const { step, attempts } = failing([bug], 'never');
      const asked: FailureClass[] = [];
      const failures: FailedAttempt[] = [];
      const thrown = await retryUntilDone(step, {
        sleep: clock.sleep,
        giveUp: (failureClass) => {
          asked.push(failureClass);
          return false;
        },
        onAttemptFailed: (f) => failures.push(f),
      }).then(
        () => null,
        (error: unknown) => error,
      );
      expect(thrown).to.equal(bug);
      expect(attempts, bug.name).to.deep.equal([0]);
      expect(clock.slept).to.deep.equal([]);
      expect(failures).to.deep.equal([]);
      expect(asked, 'giveUp is not even asked').to.deep.equal([]);
    }
    // Without any giveUp, and after transient failures were retried.
    const clock = fakeClock();
    const bug = new TypeError('x is not a function');
    const { step, attempts } = failing([new Error('Connection is closed.'), bug], 'never');
    await retryUntilDone(step, { sleep: clock.sleep, random: () => 0 }).catch(() => {});
    expect(attempts).to.deep.equal([0, 1]);
    expect(clock.slept).to.deep.equal([50]);
  });

  it("classifies with the caller's classifier when one is given", async () => {
    const clock = fakeClock();
    const { step } = failing([new Error('anything')], 'ok');
    const failures: FailedAttempt[] = [];
    await retryUntilDone(step, { sleep: clock.sleep, classify: () => 'data', onAttemptFailed: (f) => failures.push(f) });
    expect(failures.map((f) => f.failureClass)).to.deep.equal(['data']);
  });

  it('ends with RETRY_STOPPED, without another attempt or wait, once stopWhen holds after a failure', async () => {
    const clock = fakeClock();
    let alive = true;
    const attempts: number[] = [];
    const result = await retryUntilDone(
      async (attempt) => {
        attempts.push(attempt);
        if (attempt === 2) alive = false;
        throw new Error('not confirmed');
      },
      { sleep: clock.sleep, random: () => 0, stopWhen: () => !alive },
    );
    expect(result).to.equal(RETRY_STOPPED);
    expect(attempts).to.deep.equal([0, 1, 2]);
    expect(clock.slept).to.deep.equal([50, 100]);
  });

  it('does not run the step at all when stopWhen already holds', async () => {
    const clock = fakeClock();
    const { step, attempts } = failing([], 'x');
    expect(await retryUntilDone(step, { sleep: clock.sleep, stopWhen: () => true })).to.equal(RETRY_STOPPED);
    expect(attempts).to.deep.equal([]);
  });

  it('stops during a wait: the next attempt does not run', async () => {
    let stop = false;
    const { step, attempts } = failing([new Error('down'), new Error('down')], 'x');
    const result = await retryUntilDone(step, {
      sleep: async () => {
        stop = true;
      },
      stopWhen: () => stop,
    });
    expect(result).to.equal(RETRY_STOPPED);
    expect(attempts).to.deep.equal([0]);
  });

  it('returns a success even when stopWhen would hold afterwards', async () => {
    let calls = 0;
    const result = await retryUntilDone(async () => 'written', { stopWhen: () => calls++ > 0 });
    expect(result).to.equal('written');
  });
});
