import { expect } from 'chai';
import { runHungShutdownScenario, SHUTDOWN_MARGIN_MS } from '../test/integration/hung-shutdown-scenario.js';
import { rows } from './report.js';

/**
 * SIGTERM while Redis is SIGSTOPped (hung-shutdown-scenario.ts): the daemon
 * must exit within its grace period plus a margin instead of waiting on a
 * server that never answers, lose nothing, and re-count at most what it had
 * in flight (one batch per shard): the writes it sent before the stop run
 * when Redis resumes, and their deliveries, unacked, come back.
 */
describe('faults: Redis hung at shutdown', function () {
  this.timeout(300_000);

  it('SIGTERM while Redis is SIGSTOPped: exits within grace + margin, loses nothing, re-counts at most one batch per shard', async () => {
    const graceMs = 3_000;
    const outcome = await runHungShutdownScenario({ messages: 40_000, seed: 151, label: 'f-hung', graceMs });
    rows.push({
      scenario: 'Redis hung at shutdown',
      messages: outcome.messages,
      kills: 0,
      lost: outcome.lostUnits,
      overcount: outcome.overcountUnits,
      bound: outcome.boundUnits,
      estimate: 0,
      note: `SIGTERM with Redis SIGSTOPped: exit ${outcome.exitCode} after ${(outcome.exitMs / 1000).toFixed(1)} s (grace ${graceMs / 1000} s + margin ${SHUTDOWN_MARGIN_MS / 1000} s); writes sent before the stop ran on SIGCONT`,
    });
    expect(outcome.exitMs).to.be.below(graceMs + SHUTDOWN_MARGIN_MS + 1_000);
    expect(outcome.lostUnits, 'lost').to.equal(0);
    expect(outcome.overcountUnits).to.be.at.most(outcome.boundUnits);
  });
});
