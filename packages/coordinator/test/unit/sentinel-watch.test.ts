import { expect } from 'chai';
import { sentinelLine } from '../../src/commands/status.js';
import { following } from '../../src/redis/sentinel-watch.js';

describe('sentinel watch and status wording', () => {
  it('following: the connection reaches the primary the Sentinels name, or cannot be told', () => {
    expect(following('10.0.0.5:6379', '10.0.0.5:6379')).to.equal(true);
    expect(following('10.0.0.5:6379', '10.0.0.6:6379')).to.equal(false);
    expect(following('[::1]:6379', '[::1]:6379')).to.equal(true);
    // No connection now, or Sentinels that announce host names: nothing to compare.
    expect(following(null, '10.0.0.6:6379')).to.equal(null);
    expect(following('10.0.0.5:6379', 'redis-1.internal:6379')).to.equal(null);
  });

  it('tally status: one line naming the primary, and a failover in progress', () => {
    const base = {
      master: 'm',
      primary: '10.0.0.5:6379',
      flags: ['master'],
      failover_in_progress: false,
      replicas: 1,
      sentinels: 3,
      sentinel: '10.0.0.1:26379',
    };
    expect(sentinelLine(base)).to.equal('redis   sentinel master m: primary 10.0.0.5:6379, 1 replica, 3 Sentinels');
    expect(sentinelLine({ ...base, flags: ['s_down', 'o_down', 'master'], failover_in_progress: true, replicas: 0 })).to.equal(
      'redis   sentinel master m: primary 10.0.0.5:6379, 0 replicas, 3 Sentinels; failover in progress (s_down, o_down)',
    );
    expect(sentinelLine({ ...base, primary: null, error: 'no Sentinel answers (10.0.0.1:26379: connect ECONNREFUSED)' })).to.equal(
      'redis   sentinel master m: no Sentinel answers (10.0.0.1:26379: connect ECONNREFUSED)',
    );
  });
});
