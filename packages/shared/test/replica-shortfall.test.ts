import { expect } from 'chai';
import { describeShards, describeShortMaster, findShortMasters, replicationFromInfo, shortfallChanges, type ShortMaster } from '../src/replica-shortfall.js';

/** `INFO replication` of Redis 7.0, trimmed. */
const MASTER_TWO_REPLICAS = [
  '# Replication',
  'role:master',
  'connected_slaves:2',
  'slave0:ip=127.0.0.1,port=7004,state=online,offset=1442,lag=0',
  'slave1:ip=127.0.0.1,port=7005,state=wait_bgsave,offset=0,lag=0',
  'master_failover_state:no-failover',
  'master_repl_offset:1442',
  '',
].join('\r\n');

describe('replica shortfall (an unmeetable WAIT)', () => {
  it('counts only the online replicas of a master; a replica in its initial sync acknowledges nothing yet', () => {
    expect(replicationFromInfo(MASTER_TWO_REPLICAS)).to.deep.equal({ role: 'master', connectedReplicas: 2, onlineReplicas: 1 });
    expect(replicationFromInfo('# Replication\r\nrole:master\r\nconnected_slaves:0\r\n')).to.deep.equal({
      role: 'master',
      connectedReplicas: 0,
      onlineReplicas: 0,
    });
    expect(replicationFromInfo('role:slave\r\nmaster_host:127.0.0.1\r\nconnected_slaves:0\r\n').role).to.equal('replica');
    expect(replicationFromInfo('').role).to.equal('unknown');
  });

  // Eight virtual shards over three masters; b is a promoted replica with none of its own.
  const owners = ['a:1', 'b:2', 'c:3', 'b:2', 'a:1', 'b:2', undefined, 'c:3'];

  it('names each master with fewer online replicas than wanted, and the shards it holds', () => {
    const short = findShortMasters(
      1,
      owners,
      new Map([
        ['a:1', 1],
        ['b:2', 0],
        ['c:3', 2],
      ]),
    );
    expect(short).to.deep.equal([{ address: 'b:2', replicas: 0, wanted: 1, shards: [1, 3, 5] }]);
    expect(
      findShortMasters(
        2,
        owners,
        new Map([
          ['a:1', 1],
          ['b:2', 0],
          ['c:3', 2],
        ]),
      ).map((m) => [m.address, m.replicas, m.shards]),
    ).to.deep.equal([
      ['a:1', 1, [0, 4]],
      ['b:2', 0, [1, 3, 5]],
    ]);
  });

  it('finds nothing when every master has enough, or when no WAIT is asked for', () => {
    expect(
      findShortMasters(
        1,
        owners,
        new Map([
          ['a:1', 1],
          ['b:2', 1],
          ['c:3', 1],
        ]),
      ),
    ).to.deep.equal([]);
    expect(
      findShortMasters(
        0,
        owners,
        new Map([
          ['a:1', 0],
          ['b:2', 0],
          ['c:3', 0],
        ]),
      ),
    ).to.deep.equal([]);
  });

  it('a master that could not be asked keeps what the last check said of it: a timeout neither raises nor clears', () => {
    const before: ShortMaster[] = [{ address: 'b:2', replicas: 0, wanted: 1, shards: [1, 3, 5] }];
    expect(
      findShortMasters(
        1,
        owners,
        new Map([
          ['a:1', 1],
          ['b:2', null],
          ['c:3', 1],
        ]),
        before,
      ).map((m) => m.address),
    ).to.deep.equal(['b:2']);
    expect(
      findShortMasters(
        1,
        owners,
        new Map([
          ['a:1', null],
          ['b:2', 1],
          ['c:3', 1],
        ]),
        before,
      ),
    ).to.deep.equal([]);
    // Never asked at all (no entry), nothing known before: not short.
    expect(findShortMasters(1, owners, new Map())).to.deep.equal([]);
  });

  it('a master that no longer holds any shard (failed over, slots moved) is no longer short', () => {
    const before: ShortMaster[] = [{ address: 'b:2', replicas: 0, wanted: 1, shards: [1, 3, 5] }];
    const moved = owners.map((owner) => (owner === 'b:2' ? 'd:4' : owner));
    const after = findShortMasters(
      1,
      moved,
      new Map([
        ['a:1', 1],
        ['d:4', 0],
        ['c:3', 1],
      ]),
      before,
    );
    expect(after.map((m) => m.address)).to.deep.equal(['d:4']);
    const changes = shortfallChanges(before, after);
    expect(changes.started.map((m) => m.address)).to.deep.equal(['d:4']);
    expect(changes.cleared.map((m) => m.address)).to.deep.equal(['b:2']);
  });

  it('reports a change only on a transition, not on every check', () => {
    const short: ShortMaster[] = [{ address: 'b:2', replicas: 0, wanted: 1, shards: [1] }];
    expect(shortfallChanges([], short)).to.deep.equal({ started: short, cleared: [] });
    expect(shortfallChanges(short, [{ ...short[0]!, shards: [1] }])).to.deep.equal({ started: [], cleared: [] });
    expect(shortfallChanges(short, [])).to.deep.equal({ started: [], cleared: short });
  });

  it('writes shards as ranges', () => {
    expect(describeShards([7, 0, 1, 2, 3, 9, 10, 11, 12, 3])).to.equal('0-3, 7, 9-12');
    expect(describeShards([5])).to.equal('5');
    expect(describeShards([])).to.equal('');
  });

  it('words the reason with the master, its shards and both fixes', () => {
    const line = describeShortMaster({ address: '10.0.0.7:6379', replicas: 0, wanted: 1, shards: [0, 1, 2, 5] });
    expect(line).to.equal(
      'redis WAIT for 1 replica cannot be met: master 10.0.0.7:6379 has 0 online replicas (virtual shards 0-2, 5: their batches wait unacked); ' +
        'bring a replica of it back, or lower TALLY_REDIS_WAIT_REPLICAS and restart',
    );
    expect(describeShortMaster({ address: 'h:1', replicas: 1, wanted: 2, shards: [3] }))
      .to.include('WAIT for 2 replicas')
      .and.include('has 1 online replica (');
  });
});
