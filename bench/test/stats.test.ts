import { expect } from 'chai';
import { median, medianRatio, pairwiseRatios, percentileSorted, summarizeLatencies } from '../src/stats.js';

describe('stats', () => {
  it('takes the median of odd and even counts, ignoring non-finite values', () => {
    expect(median([3, 1, 2])).to.equal(2);
    expect(median([4, 1, 3, 2])).to.equal(2.5);
    expect(median([5, Number.NaN, 1, Infinity, 3])).to.equal(3);
    expect(median([])).to.be.NaN;
  });

  it('uses nearest-rank percentiles: never a value nobody measured', () => {
    const sorted = Float64Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentileSorted(sorted, 50)).to.equal(50);
    expect(percentileSorted(sorted, 99)).to.equal(99);
    expect(percentileSorted(sorted, 100)).to.equal(100);
    expect(percentileSorted(sorted, 0)).to.equal(1);
    expect(percentileSorted([7], 99)).to.equal(7);
    expect(percentileSorted([], 50)).to.be.NaN;
    expect(() => percentileSorted([1], 101)).to.throw(RangeError);
  });

  it('summarizes latencies without assuming sorted input', () => {
    const s = summarizeLatencies([30, 10, 20, 1000, 40]);
    expect(s).to.deep.equal({ samples: 5, p50: 30, p99: 1000, max: 1000 });
  });

  it('computes ratios pair by pair within a round, then the median of those', () => {
    // Round speeds drift (the machine is shared) but the ratio stays 0.5.
    const tally = [5_000, 10_000, 7_000];
    const ceiling = [10_000, 20_000, 14_000];
    expect(pairwiseRatios(tally, ceiling)).to.deep.equal([0.5, 0.5, 0.5]);
    expect(medianRatio(tally, ceiling)).to.equal(0.5);
    // A ratio of medians would say 7000 / 14000 = 0.5 here too, but not when rounds drift unevenly:
    expect(medianRatio([1, 9, 5], [2, 10, 20])).to.equal(0.5);
  });

  it('skips rounds where either contender is missing rather than guessing', () => {
    expect(pairwiseRatios([1, null, 3, 4], [2, 2, undefined, 0])).to.deep.equal([0.5]);
    expect(medianRatio([null], [1])).to.be.NaN;
  });
});
