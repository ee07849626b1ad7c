import { expect } from 'chai';
import { PrimaryTracker, sentinelMasterFromReply, type SentinelMasterInfo } from '../src/sentinel-state.js';

const master = (address: string, flags = 'master'): SentinelMasterInfo => ({ address, flags: flags.split(','), replicas: 1, sentinels: 3, quorum: 2 });
const look = (m: SentinelMasterInfo | null, following: boolean | null = true) => ({ master: m, sentinel: m === null ? null : '10.0.0.1:26379', following });

describe('sentinel-state.ts', () => {
  it('reads a SENTINEL MASTER reply', () => {
    const reply = [
      'name',
      'm',
      'ip',
      '10.0.0.5',
      'port',
      '6379',
      'flags',
      's_down,o_down,master,failover_in_progress',
      'num-slaves',
      '2',
      'num-other-sentinels',
      '2',
      'quorum',
      '2',
    ];
    expect(sentinelMasterFromReply(reply)).to.deep.equal({
      address: '10.0.0.5:6379',
      flags: ['s_down', 'o_down', 'master', 'failover_in_progress'],
      replicas: 2,
      sentinels: 3,
      quorum: 2,
    });
    expect(sentinelMasterFromReply(['name', 'm', 'ip', '::1', 'port', '7000']).address).to.equal('[::1]:7000');
    expect(sentinelMasterFromReply(null)).to.include({ address: null, replicas: 0, sentinels: 1 });
  });

  it('follows a failover: down, switched (counted once), over', () => {
    const tracker = new PrimaryTracker('m');
    expect(tracker.observe(look(master('10.0.0.5:6379')), 0)).to.deep.equal([]);
    expect(tracker.state).to.include({ primary: '10.0.0.5:6379', failoverInProgress: false, failovers: 0, sentinelsAnswer: true });
    // 'disconnected' alone is a Sentinel's link, not yet a failover.
    expect(tracker.observe(look(master('10.0.0.5:6379', 'master,disconnected'), null), 500)).to.deep.equal([]);

    const started = tracker.observe(look(master('10.0.0.5:6379', 's_down,o_down,master,disconnected,failover_in_progress'), null), 1_000);
    expect(started).to.have.length(1);
    expect(started[0]).to.include({ kind: 'failover-started' });
    expect(tracker.state.reason).to.equal('redis failover in progress: the Sentinels see primary 10.0.0.5:6379 of m as s_down, o_down, failover_in_progress');
    expect(tracker.state).to.include({ failoverInProgress: true, sinceMs: 1_000 });
    // Seen again: no new line.
    expect(tracker.observe(look(master('10.0.0.5:6379', 's_down,o_down,master'), null), 1_250)).to.deep.equal([]);

    const switched = tracker.observe(look(master('10.0.0.6:6379'), true), 2_500);
    expect(switched).to.deep.equal([
      { kind: 'switched', from: '10.0.0.5:6379', to: '10.0.0.6:6379', failovers: 1 },
      { kind: 'failover-ended', primary: '10.0.0.6:6379', lastedMs: 1_500 },
    ]);
    expect(tracker.state).to.include({ primary: '10.0.0.6:6379', failovers: 1, failoverInProgress: false, reason: null, sinceMs: null });
    expect(tracker.observe(look(master('10.0.0.6:6379')), 3_500)).to.deep.equal([]);
    expect(tracker.state.failovers).to.equal(1);
  });

  it('a connection still on another node than the named primary is a failover in progress', () => {
    const tracker = new PrimaryTracker('m');
    tracker.observe(look(master('10.0.0.5:6379')), 0);
    const changes = tracker.observe(look(master('10.0.0.6:6379'), false), 100);
    expect(changes.map((change) => change.kind)).to.deep.equal(['switched', 'failover-started']);
    expect(tracker.state.reason).to.equal("redis failover in progress: reconnecting to m's primary 10.0.0.6:6379");
    expect(tracker.observe(look(master('10.0.0.6:6379'), true), 400).map((change) => change.kind)).to.deep.equal(['failover-ended']);
  });

  it('no Sentinel answering keeps the last primary and says so once', () => {
    const tracker = new PrimaryTracker('m');
    tracker.observe(look(master('10.0.0.5:6379')), 0);
    expect(tracker.observe(look(null, null), 100)).to.deep.equal([{ kind: 'sentinels-lost' }]);
    expect(tracker.observe(look(null, null), 200)).to.deep.equal([]);
    expect(tracker.state).to.include({ primary: '10.0.0.5:6379', sentinelsAnswer: false, failovers: 0 });
    expect(tracker.observe(look(master('10.0.0.5:6379')), 300)).to.deep.equal([{ kind: 'sentinels-back', sentinel: '10.0.0.1:26379' }]);
  });

  it('the first answer sets the primary without counting a failover', () => {
    const tracker = new PrimaryTracker('m');
    tracker.observe(look(null, null), 0);
    tracker.observe(look(master('10.0.0.6:6379')), 100);
    expect(tracker.state).to.include({ primary: '10.0.0.6:6379', failovers: 0 });
  });
});
