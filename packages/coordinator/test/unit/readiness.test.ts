import { expect } from 'chai';
import { judgeReadiness, type ReadinessFacts } from '../../src/telemetry/readiness.js';

const healthy: ReadinessFacts = {
  state: 'running',
  consuming: true,
  redisConnected: true,
  refusal: null,
  oldestUnackedMs: 100,
  stallMs: 30_000,
  nowMs: Date.parse('2026-01-01T00:01:00Z'),
};

describe('judgeReadiness', () => {
  it('is ready when running, connected, consuming and not stalled', () => {
    expect(judgeReadiness(healthy)).to.deep.equal({ ready: true, reason: null, since: null });
    expect(judgeReadiness({ ...healthy, oldestUnackedMs: null }).ready).to.equal(true);
  });

  it('names a refusing Redis with the reply and when it began', () => {
    const verdict = judgeReadiness({
      ...healthy,
      refusal: {
        errorType: 'OOM',
        failureClass: 'transient',
        message: "OOM command not allowed when used memory > 'maxmemory'.",
        sinceMs: Date.parse('2026-01-01T00:00:30Z'),
        sources: ['shard 3'],
      },
      oldestUnackedMs: 10_000,
    });
    expect(verdict).to.deep.equal({
      ready: false,
      reason: "redis refusing writes: OOM command not allowed when used memory > 'maxmemory'.",
      since: '2026-01-01T00:00:30.000Z',
    });
  });

  it('says unavailable, not refusing, for a Redis that does not answer', () => {
    const verdict = judgeReadiness({
      ...healthy,
      refusal: { errorType: 'unavailable', failureClass: 'transient', message: 'Command timed out', sinceMs: healthy.nowMs, sources: ['shard 0'] },
    });
    expect(verdict.reason).to.equal('redis unavailable: Command timed out');
  });

  it('reports a stall past the threshold, dated from when the threshold passed', () => {
    expect(judgeReadiness({ ...healthy, oldestUnackedMs: 29_999 }).ready).to.equal(true);
    const verdict = judgeReadiness({ ...healthy, oldestUnackedMs: 42_500 });
    expect(verdict).to.deep.equal({ ready: false, reason: 'stalled: oldest unacked delivery 42 s old', since: '2026-01-01T00:00:47.500Z' });
  });

  it('names every reason that holds, the cause first, dated by the earliest', () => {
    expect(judgeReadiness({ ...healthy, state: 'stopping', consuming: false }).reason).to.equal('daemon stopping');
    expect(judgeReadiness({ ...healthy, redisConnected: false, oldestUnackedMs: 60_000 }).reason).to.equal(
      'redis connection down; stalled: oldest unacked delivery 60 s old',
    );
    expect(judgeReadiness({ ...healthy, consuming: false }).reason).to.equal('not consuming from RabbitMQ');
    const both = judgeReadiness({
      ...healthy,
      refusal: { errorType: 'NOPERM', failureClass: 'fatal', message: 'NOPERM no permissions', sinceMs: healthy.nowMs - 50_000, sources: ['shard 5'] },
      oldestUnackedMs: 45_000,
    });
    expect(both.reason).to.equal('redis refusing writes: NOPERM no permissions; stalled: oldest unacked delivery 45 s old');
    expect(both.since).to.equal('2026-01-01T00:00:10.000Z');
  });

  it('names a master that cannot meet the WAIT, with its shards and the fix, before the stall it causes', () => {
    const verdict = judgeReadiness({
      ...healthy,
      replicasShort: [{ address: '127.0.0.1:7002', replicas: 0, wanted: 1, shards: [1, 2, 3, 8], sinceMs: healthy.nowMs - 95_000 }],
      oldestUnackedMs: 88_000,
    });
    expect(verdict.ready).to.equal(false);
    expect(verdict.reason).to.match(
      /^redis WAIT for 1 replica cannot be met: master 127\.0\.0\.1:7002 has 0 online replicas \(virtual shards 1-3, 8: .*TALLY_REDIS_WAIT_REPLICAS.*; stalled: oldest unacked delivery 88 s old$/,
    );
    expect(verdict.since).to.equal('2025-12-31T23:59:25.000Z');
    // Not short, or no WAIT at all: nothing said.
    expect(judgeReadiness({ ...healthy, replicasShort: [] }).ready).to.equal(true);
  });

  it('names a Sentinel failover first, as the cause of the refusals and the lost connection', () => {
    const verdict = judgeReadiness({
      ...healthy,
      redisConnected: false,
      failover: { reason: 'redis failover in progress: the Sentinels see primary 10.0.0.5:6379 of m as o_down', sinceMs: Date.parse('2026-01-01T00:00:58Z') },
    });
    expect(verdict.ready).to.equal(false);
    expect(verdict.reason).to.equal('redis failover in progress: the Sentinels see primary 10.0.0.5:6379 of m as o_down; redis connection down');
    expect(verdict.since).to.equal('2026-01-01T00:00:58.000Z');
    expect(judgeReadiness({ ...healthy, failover: null }).ready).to.equal(true);
  });
});
