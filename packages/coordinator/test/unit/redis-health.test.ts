import { expect } from 'chai';
import { Redis } from 'ioredis';
import { describeRefusal } from '@tally/shared';
import { freePort } from '@tally/testkit';
import { RedisHealth, REFUSAL_STALE_MS } from '../../src/redis/redis-health.js';

function recordingLog() {
  const lines: Array<{ level: string; fields: Record<string, unknown>; message: string }> = [];
  const at = (level: string) => (fields: Record<string, unknown>, message: string) => lines.push({ level, fields, message });
  return { lines, log: { warn: at('warn'), info: at('info'), error: at('error'), debug: at('debug'), fatal: at('fatal') } as never };
}

describe('RedisHealth', () => {
  it('logs one line when refusals start and one when the last source recovers', () => {
    let now = 1_000;
    const { lines, log } = recordingLog();
    const health = new RedisHealth(log, () => now);
    expect(health.current()).to.equal(null);
    health.refused('shard 1', 'OOM', 'transient', 'OOM command not allowed');
    now += 500;
    health.refused('shard 2', 'OOM', 'transient', 'OOM command not allowed');
    health.refused('shard 1', 'OOM', 'transient', 'OOM command not allowed');
    expect(lines.filter((l) => l.level === 'warn')).to.have.length(1);
    expect(lines[0]!.message).to.match(/^redis refusing writes: OOM command not allowed/);
    const state = health.current()!;
    expect(state).to.include({ errorType: 'OOM', sinceMs: 1_000 });
    expect(state.sources).to.have.members(['shard 1', 'shard 2']);
    expect(health.attemptsByType.get('OOM')).to.equal(3);
    health.recovered('shard 1');
    expect(health.current(), 'shard 2 still refused').to.not.equal(null);
    now += 2_000;
    health.recovered('shard 2');
    expect(health.current()).to.equal(null);
    const cleared = lines.filter((l) => l.level === 'info');
    expect(cleared).to.have.length(1);
    expect(cleared[0]!.fields.lastedMs).to.equal(2_500);
  });

  it('forgets a source that stopped reporting (a thread that died mid-retry)', () => {
    let now = 0;
    const { lines, log } = recordingLog();
    const health = new RedisHealth(log, () => now);
    health.refused('shard 4', 'READONLY', 'transient', "READONLY You can't write against a read only replica.");
    now += REFUSAL_STALE_MS + 1;
    expect(health.current()).to.equal(null);
    expect(lines.some((l) => l.message === 'redis accepts writes again')).to.equal(true);
  });

  it("applies the worker threads' health events as they arrive (thread-protocol.ts ThreadEvent)", () => {
    const { log } = recordingLog();
    const health = new RedisHealth(log);
    health.apply({ kind: 'refused', source: 'shard 0', errorType: 'MASTERDOWN', failureClass: 'transient', message: 'MASTERDOWN Link with MASTER is down' });
    expect(health.current()?.errorType).to.equal('MASTERDOWN');
    health.apply({ kind: 'recovered', source: 'shard 0' });
    expect(health.current()).to.equal(null);
  });

  it('describeRefusal keeps the reply word and class, which a thread boundary would lose', () => {
    const reply = Object.assign(new Error("OOM command not allowed when used memory > 'maxmemory'."), { name: 'ReplyError' });
    expect(describeRefusal(reply)).to.deep.equal({ errorType: 'OOM', failureClass: 'transient', message: reply.message });
    const loading = Object.assign(new Error('LOADING Redis is loading the dataset in memory'), { name: 'ReplyError' });
    expect(describeRefusal(loading).errorType).to.equal('LOADING');
    const noperm = Object.assign(new Error('NOPERM No permissions to access a key'), { name: 'ReplyError' });
    expect(describeRefusal(noperm)).to.include({ errorType: 'NOPERM', failureClass: 'fatal' });
    expect(describeRefusal(new Error('Connection is closed.'))).to.include({ errorType: 'unavailable', failureClass: 'transient' });
  });

  it("describeRefusal words a reply that never came for an operator, not as ioredis's maxRetriesPerRequest option", async () => {
    // A real client as the daemon's are made (maxRetriesPerRequest 0), against a port nobody listens on.
    const client = new Redis({ host: '127.0.0.1', port: await freePort(), maxRetriesPerRequest: 0, retryStrategy: () => 100 });
    client.on('error', () => {});
    try {
      const error: unknown = await client.get('k').then(
        () => null,
        (failure: unknown) => failure,
      );
      expect(String(error), 'what ioredis says').to.match(/maxRetriesPerRequest/);
      const refusal = describeRefusal(error);
      expect(refusal).to.include({ errorType: 'unavailable', failureClass: 'transient' });
      expect(refusal.message).to.equal('no reply from Redis (not connected, or the connection dropped); ioredis: MaxRetriesPerRequestError');
      expect(describeRefusal(new Error('Connection is closed.')).message).to.equal(
        'no reply from Redis (the connection is closed); ioredis: "Connection is closed."',
      );
    } finally {
      client.disconnect();
    }
  });
});
