import { expect } from 'chai';
import { judgeReadiness, type ReadinessFacts } from '../../src/readiness.js';

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
      oldestUnackedMs: 45_000,
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

  it('ranks: not running, then refusal, then connections, then stall', () => {
    expect(judgeReadiness({ ...healthy, state: 'stopping', consuming: false }).reason).to.equal('daemon stopping');
    expect(judgeReadiness({ ...healthy, redisConnected: false, oldestUnackedMs: 60_000 }).reason).to.equal('redis connection down');
    expect(judgeReadiness({ ...healthy, consuming: false, oldestUnackedMs: 60_000 }).reason).to.equal('not consuming from RabbitMQ');
  });
});
