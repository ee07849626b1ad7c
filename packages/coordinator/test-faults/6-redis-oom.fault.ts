import { expect } from 'chai';
import { runOomScenario } from '../test/integration/oom-scenario.js';
import { rows } from './report.js';

/**
 * Redis out of memory under noeviction mid-stream (oom-scenario.ts, shared
 * with the integration suite): a filler key takes the memory, every write
 * is refused, the daemon waits visibly (/readyz 503 with the reason, the
 * refusal counter) and acks nothing; once the filler goes, everything is
 * counted once. No crash, so no overcount.
 */
describe('faults: Redis out of memory mid-stream', function () {
  this.timeout(300_000);

  it('refuses writes (noeviction) while a filler key holds the memory: waits visibly, acks nothing, counts everything once there is room', async () => {
    const outcome = await runOomScenario({ before: 10_000, during: 10_000, seed: 131, label: 'f-oom' });
    rows.push({
      scenario: 'Redis out of memory mid-stream',
      messages: outcome.messages,
      kills: 0,
      lost: outcome.lostUnits,
      overcount: outcome.overcountUnits,
      bound: 0,
      estimate: 0,
      note: `OOM for ${(outcome.refusedForMs / 1000).toFixed(1)} s, ${outcome.refusedAttempts} refused attempts; /readyz 503 "${outcome.reason.slice(0, 40)}…"`,
    });
    expect(outcome.lostUnits, 'lost').to.equal(0);
    expect(outcome.overcountUnits, 'no crash, no lost channel: nothing counted twice').to.equal(0);
  });
});
