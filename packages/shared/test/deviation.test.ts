import { expect } from 'chai';
import { estimateDeviation, formatDeviation, parseDuration, parseRecovery, slowRecoveryShare, type DeviationConfig } from '../src/deviation.js';

const CONFIG: DeviationConfig = { mode: 'two-step', markerTtlS: 600, batchSize: 500, prefetch: 2000, virtualShards: 16 };

function codeOf(run: () => unknown): string | undefined {
  try {
    run();
  } catch (error) {
    return (error as { code?: string }).code;
  }
  return undefined;
}

describe('deviation estimator', () => {
  it('reads durations with units', () => {
    expect(parseDuration('90s')).to.equal(90);
    expect(parseDuration('5m')).to.equal(300);
    expect(parseDuration('1.5h')).to.equal(5400);
    expect(parseDuration('250ms')).to.equal(0.25);
    expect(parseDuration('42')).to.equal(42);
    expect(codeOf(() => parseDuration('soon'))).to.equal('TALLY_CLI_USAGE');
  });

  it('reads a recovery distribution and refuses one whose times go down', () => {
    expect(parseRecovery('p90=300s, p50=90s,max=1h')).to.deep.equal([
      { percentile: 50, seconds: 90 },
      { percentile: 90, seconds: 300 },
      { percentile: 100, seconds: 3600 },
    ]);
    expect(codeOf(() => parseRecovery('p50=10m,p90=1m'))).to.equal('TALLY_CLI_USAGE');
    expect(codeOf(() => parseRecovery('p50=1m,p50=2m'))).to.equal('TALLY_CLI_USAGE');
    expect(codeOf(() => parseRecovery('q50=1m'))).to.equal('TALLY_CLI_USAGE');
    expect(codeOf(() => parseRecovery(''))).to.equal('TALLY_CLI_USAGE');
  });

  it('interpolates P(recovery > TTL) between percentiles and bounds it by them', () => {
    const points = parseRecovery('p50=90s,p90=300s,p99=1200s');
    const share = slowRecoveryShare(points, 600);
    // 600 s lies a third of the way from p90 (300 s) to p99 (1200 s).
    expect(share.expected).to.be.closeTo(1 - (0.9 + 0.09 / 3), 1e-12);
    expect(share.atMost).to.be.closeTo(0.1, 1e-12);
    expect(share.atLeast).to.be.closeTo(0.01, 1e-12);
    // Below the first percentile: interpolated from zero.
    expect(slowRecoveryShare(points, 45).expected).to.be.closeTo(0.75, 1e-12);
    // Beyond the last: the whole tail is taken as slow.
    const tail = slowRecoveryShare(points, 7200);
    expect(tail.expected).to.be.closeTo(0.01, 1e-12);
    expect(tail.atMost).to.be.closeTo(0.01, 1e-12);
    // A closed distribution: all recoveries at 5 s.
    const fixed = parseRecovery('min=5s,max=5s');
    expect(slowRecoveryShare(fixed, 2).expected).to.equal(1);
    expect(slowRecoveryShare(fixed, 10).expected).to.equal(0);
  });

  it('adds the window term and the slow-recovery term, each bounded', () => {
    // Busy for 100 s with 3 messages in the window and 400 occupied-unacked on average.
    const counters = { loaded_ms: 100_000, window_message_ms: 300_000, occupied_unacked_message_ms: 40_000_000, received: 1000, duplicates: 20 };
    const estimate = estimateDeviation({ counters, config: CONFIG, crashesPerMonth: 4, recovery: parseRecovery('min=10s,p90=300s,max=1200s') });
    expect(estimate.perCrash.window).to.equal(3);
    expect(estimate.perCrash.occupiedUnacked).to.equal(400);
    const p = estimate.slowShare.expected; // 600 s: a third of the way from p90 to p100
    expect(p).to.be.closeTo(0.1 * (2 / 3), 1e-12);
    expect(estimate.expectedPerMonth).to.be.closeTo(4 * 3 + 4 * p * 400, 1e-9);
    expect(estimate.boundPerMonth).to.be.closeTo(4 * 2000 + 4 * 0.1 * 2000, 1e-9);
    expect(estimate.expectedPerMonth).to.be.at.most(estimate.boundPerMonth);
    expect(estimate.observed.duplicateRate).to.equal(0.02);
    const text = formatDeviation(estimate);
    expect(text).to.include('crash inside the window');
    expect(text).to.include('recovery slower than the marker TTL');
  });

  it('bounds the window by one batch per shard when that is below the prefetch', () => {
    const estimate = estimateDeviation({ counters: {}, config: { ...CONFIG, batchSize: 50 }, crashesPerMonth: 1, recovery: parseRecovery('max=1s') });
    expect(estimate.perCrash.windowBound).to.equal(800);
    expect(estimate.perCrash.measured).to.equal(false);
    expect(estimate.boundPerMonth).to.equal(800);
  });

  it('has no window term in atomic mode', () => {
    const estimate = estimateDeviation({
      counters: { loaded_ms: 1000, window_message_ms: 0, occupied_unacked_message_ms: 5000 },
      config: { ...CONFIG, mode: 'atomic' },
      crashesPerMonth: 2,
      recovery: parseRecovery('min=20m,max=30m'),
    });
    expect(estimate.terms[0]!.bound).to.equal(0);
    expect(estimate.expectedPerMonth).to.equal(2 * 5);
  });

  it('is 0 for a stream, whatever the counters and the crash pattern: replays are skipped by the watermarks', () => {
    const counters = {
      loaded_ms: 100_000,
      window_message_ms: 300_000,
      occupied_unacked_message_ms: 40_000_000,
      redelivered_unmarked: 7,
      partial_duplicates: 3,
      stream_rollbacks: 2,
      stream_gap_offsets: 40,
    };
    const estimate = estimateDeviation({ counters, config: { ...CONFIG, source: 'stream' }, crashesPerMonth: 30, recovery: parseRecovery('min=20m,max=3h') });
    expect(estimate.expectedPerMonth).to.equal(0);
    expect(estimate.boundPerMonth).to.equal(0);
    expect(estimate.observed.recountCeiling).to.equal(0);
    expect(estimate.observed).to.include({ streamRollbacks: 2, streamGapOffsets: 40 });
    const text = formatDeviation(estimate);
    expect(text).to.include('stream source (exact by construction').and.include('40 offsets lost to retention');
  });
});
