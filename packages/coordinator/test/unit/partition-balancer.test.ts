import { expect } from 'chai';
import { partitionsOf } from '@tally/shared';
import type { LiveDaemon } from '../../src/fleet/heartbeat.js';
import { partitionPeers } from '../../src/fleet/partition-balancer.js';

/** A live daemon's heartbeat as listDaemons reads it: consuming `q` with 4 partitions unless told otherwise. */
function daemon(id: string, overrides: Partial<LiveDaemon> = {}): LiveDaemon {
  return {
    id,
    host: 'h',
    pid: 1,
    mode: 'two-step',
    source: 'queue',
    version: '0.1.0',
    queue: 'q',
    started_at: '2025-01-01T00:00:00.000Z',
    consuming: true,
    oldest_unacked_s: null,
    in_flight: 0,
    amqp_node: null,
    last_beat: '2025-01-01T00:00:05.000Z',
    ttl_ms: 15_000,
    partitions_total: 4,
    partitions: [],
    leaving: false,
    last_beat_age_s: 0,
    ...overrides,
  };
}

const options = { queue: 'q', partitions: 4 };

describe('partitionPeers (pure: the daemons that share out the partitions)', () => {
  it('lists the daemons of the same queue and partition count, by id, sorted', () => {
    const daemons = [daemon('c'), daemon('a'), daemon('b')];
    expect(partitionPeers(daemons, options)).to.deep.equal(['a', 'b', 'c']);
    // The order they were listed in (SCAN's, node by node) does not matter: every daemon computes the same list.
    expect(partitionPeers([...daemons].reverse(), options)).to.deep.equal(['a', 'b', 'c']);
  });

  it('leaves out a daemon that is stopping: the others take its partitions at their next beat', () => {
    const daemons = [daemon('a'), daemon('b', { leaving: true }), daemon('c')];
    expect(partitionPeers(daemons, options)).to.deep.equal(['a', 'c']);
    // What that means for a's share: half of the 4, not a third.
    expect(partitionsOf(4, partitionPeers(daemons, options), 'a')).to.have.length(2);
    expect(partitionPeers([daemon('a', { leaving: true })], options)).to.deep.equal([]);
  });

  it('leaves out a daemon on another queue, even one whose name only starts the same', () => {
    const daemons = [daemon('a'), daemon('b', { queue: 'other' }), daemon('c', { queue: 'q.0' }), daemon('d', { queue: 'Q' }), daemon('e')];
    expect(partitionPeers(daemons, options)).to.deep.equal(['a', 'e']);
  });

  it('leaves out a daemon of the same queue with another partition count (one configured differently, or older than partitions)', () => {
    const daemons = [daemon('a'), daemon('b', { partitions_total: 8 }), daemon('c', { partitions_total: 1 }), daemon('d')];
    expect(partitionPeers(daemons, options)).to.deep.equal(['a', 'd']);
    expect(partitionPeers(daemons, { queue: 'q', partitions: 8 })).to.deep.equal(['b']);
  });

  it('counts a daemon that is not consuming yet (starting, or waiting for a server): it will', () => {
    expect(partitionPeers([daemon('a', { consuming: false }), daemon('b')], options)).to.deep.equal(['a', 'b']);
  });

  it('is empty with no daemon listed', () => {
    expect(partitionPeers([], options)).to.deep.equal([]);
  });
});
