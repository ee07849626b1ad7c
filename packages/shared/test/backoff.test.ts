import { expect } from 'chai';
import { backoffDelay, DEFAULT_BACKOFF, type BackoffOptions } from '../src/backoff.js';

const ALMOST_ONE = 1 - Number.EPSILON;

function ceiling(attempt: number, options: BackoffOptions = DEFAULT_BACKOFF): number {
  return Math.min(options.capMs, options.baseMs * 2 ** Math.min(attempt, 20));
}

describe('backoffDelay', function () {
  // 32,000 draws: well under a second alone, but the machine is shared.
  this.timeout(30_000);

  it('has frozen defaults of 100 ms base and 5 s cap', () => {
    expect(DEFAULT_BACKOFF).to.deep.equal({ baseMs: 100, capMs: 5_000 });
    expect(Object.isFrozen(DEFAULT_BACKOFF)).to.equal(true);
  });

  it('is half the ceiling with no jitter and the ceiling with full jitter', () => {
    const expected: Array<[attempt: number, low: number, high: number]> = [
      [0, 50, 100],
      [1, 100, 200],
      [2, 200, 400],
      [3, 400, 800],
      [4, 800, 1600],
      [5, 1600, 3200],
      [6, 2500, 5000],
      [7, 2500, 5000],
      [30, 2500, 5000],
      [1_000_000, 2500, 5000],
    ];
    for (const [attempt, low, high] of expected) {
      expect(
        backoffDelay(attempt, DEFAULT_BACKOFF, () => 0),
        `attempt ${attempt}`,
      ).to.equal(low);
      expect(
        backoffDelay(attempt, DEFAULT_BACKOFF, () => ALMOST_ONE),
        `attempt ${attempt}`,
      ).to.equal(high);
      expect(
        backoffDelay(attempt, DEFAULT_BACKOFF, () => 0.5),
        `attempt ${attempt}`,
      ).to.equal(Math.round(low * 1.5));
    }
  });

  it('stays within [ceiling/2, ceiling] for random jitter, as a positive integer', () => {
    let seed = 12345;
    const random = () => {
      seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
      return seed / 2 ** 32;
    };
    const optionsList: BackoffOptions[] = [DEFAULT_BACKOFF, { baseMs: 1, capMs: 10 }, { baseMs: 250, capMs: 60_000 }, { baseMs: 7, capMs: 7 }];
    for (const options of optionsList) {
      for (let attempt = 0; attempt < 40; attempt++) {
        const top = ceiling(attempt, options);
        for (let n = 0; n < 200; n++) {
          const delay = backoffDelay(attempt, options, random);
          expect(Number.isInteger(delay)).to.equal(true);
          expect(delay).to.be.at.least(1);
          expect(delay).to.be.within(Math.floor(top / 2), top);
          expect(delay).to.be.at.most(options.capMs);
        }
      }
    }
  });

  it('uses Math.random by default and stays in bounds', () => {
    for (let n = 0; n < 1000; n++) {
      expect(backoffDelay(3)).to.be.within(400, 800);
      expect(backoffDelay(50)).to.be.within(2500, 5000);
    }
  });

  it('never waits zero, even with a 1 ms base', () => {
    expect(backoffDelay(0, { baseMs: 1, capMs: 1 }, () => 0)).to.equal(1);
  });

  it('has a non-decreasing ceiling that reaches the cap and stays there', () => {
    let previous = 0;
    for (let attempt = 0; attempt <= 100; attempt++) {
      const high = backoffDelay(attempt, DEFAULT_BACKOFF, () => ALMOST_ONE);
      expect(high).to.be.at.least(previous);
      previous = high;
    }
    expect(previous).to.equal(DEFAULT_BACKOFF.capMs);
  });

  it('does not overflow for huge attempts with a huge cap', () => {
    const delay = backoffDelay(Number.MAX_SAFE_INTEGER, { baseMs: 1000, capMs: Number.MAX_SAFE_INTEGER }, () => ALMOST_ONE);
    expect(Number.isFinite(delay)).to.equal(true);
    expect(delay).to.equal(1000 * 2 ** 20);
  });
});
