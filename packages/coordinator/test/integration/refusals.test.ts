import { expect } from 'chai';
import { runOomScenario } from './oom-scenario.js';

describe('refused writes at run time (integration: private redis-server, real RabbitMQ)', function () {
  this.timeout(300_000);

  it('Redis out of memory mid-stream: /readyz 503 with the OOM reason, metric and log, nothing acked meanwhile; counts exact once it has room', async () => {
    const outcome = await runOomScenario({ before: 2_000, during: 2_000, seed: 91, label: 'oom' });
    expect(outcome.reason).to.match(/^redis refusing writes: OOM command not allowed/);
    expect(outcome.lostUnits, 'lost').to.equal(0);
    // No crash, no dropped channel: the receipt settles every retried write, so nothing is counted twice either.
    expect(outcome.overcountUnits, 'overcount').to.equal(0);
  });
});
