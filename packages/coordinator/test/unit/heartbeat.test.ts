import { expect } from 'chai';
import { parseHeartbeat } from '../../src/fleet/heartbeat.js';

const valid = {
  id: 'h:1:ab',
  host: 'h',
  pid: 1,
  mode: 'atomic',
  version: '0.1.0',
  queue: 'q',
  started_at: '2025-01-01T00:00:00.000Z',
  consuming: true,
  oldest_unacked_s: 2.5,
  in_flight: 7,
  last_beat: '2025-01-01T00:00:05.000Z',
  ttl_ms: 15_000,
};

describe('parseHeartbeat', () => {
  it('reads a record and ages its last beat from the remaining TTL (the server clock)', () => {
    const daemon = parseHeartbeat(JSON.stringify(valid), 12_000);
    expect(daemon).to.deep.include({ pid: 1, mode: 'atomic', in_flight: 7, oldest_unacked_s: 2.5, last_beat_age_s: 3 });
    expect(parseHeartbeat(JSON.stringify({ ...valid, oldest_unacked_s: null }), 15_000)?.oldest_unacked_s).to.equal(null);
  });

  it('reads the broker node the daemon is on; a record without one (an older daemon) reads as null', () => {
    expect(parseHeartbeat(JSON.stringify({ ...valid, amqp_node: 'amqps://tally:***@r2:5671/v' }), 15_000)?.amqp_node).to.equal('amqps://tally:***@r2:5671/v');
    expect(parseHeartbeat(JSON.stringify({ ...valid, amqp_node: null }), 15_000)?.amqp_node).to.equal(null);
    expect(parseHeartbeat(JSON.stringify(valid), 15_000)?.amqp_node).to.equal(null);
    expect(parseHeartbeat(JSON.stringify({ ...valid, amqp_node: 7 }), 15_000)).to.equal(null);
  });

  it('skips what is not a heartbeat instead of failing the listing', () => {
    for (const raw of [
      '',
      'not json',
      'null',
      '[]',
      '42',
      JSON.stringify({ ...valid, mode: 'three-step' }),
      JSON.stringify({ ...valid, pid: 'x' }),
      JSON.stringify({ ...valid, consuming: 'yes' }),
      JSON.stringify({ ...valid, oldest_unacked_s: -1 }),
      JSON.stringify({ ...valid, host: 'x'.repeat(600) }),
      JSON.stringify({ ...valid, ttl_ms: undefined }),
    ]) {
      expect(parseHeartbeat(raw, 1_000), raw.slice(0, 60)).to.equal(null);
    }
  });
});
