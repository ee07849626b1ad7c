import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'chai';
import { DEPLOY, requireTool, runTool } from './ops-tools.js';

const RULES_DIR = join(DEPLOY, 'prometheus');

describe('deploy/prometheus: alert and recording rules (promtool)', function () {
  this.timeout(120_000);

  it('passes promtool check rules', async () => {
    const run = await runTool(requireTool('promtool', 'prometheus'), ['check', 'rules', 'tally.rules.yml'], { cwd: RULES_DIR });
    expect(run.code, run.stdout + run.stderr).to.equal(0);
    expect(run.stdout).to.match(/SUCCESS: \d+ rules found/);
  });

  it('passes its unit tests: promtool test rules tally.rules.test.yml', async () => {
    const run = await runTool(requireTool('promtool', 'prometheus'), ['test', 'rules', 'tally.rules.test.yml'], { cwd: RULES_DIR });
    expect(run.code, run.stdout + run.stderr).to.equal(0);
    expect(run.stdout).to.include('SUCCESS');
  });

  it('has a test for every alert it defines, and defines an alert for each failure Tally must make visible', async () => {
    const rules = await readFile(join(RULES_DIR, 'tally.rules.yml'), 'utf8');
    const tests = await readFile(join(RULES_DIR, 'tally.rules.test.yml'), 'utf8');
    const alerts = [...rules.matchAll(/^\s+- alert: (\S+)$/gm)].map((m) => m[1]!);
    const records = [...rules.matchAll(/^\s+- record: (\S+)$/gm)].map((m) => m[1]!);
    expect(alerts).to.include.members([
      'TallyCrashWindowFired',
      'TallyDeadLetters',
      'TallyStalled',
      'TallyNoConsumption',
      'TallyRabbitMQDown',
      'TallyRedisDown',
      'TallyOvercountHigh',
      'TallyRedisReplicasShort',
    ]);
    expect(records).to.include('tally:recount_ceiling:ratio1h');
    for (const alert of alerts) expect(tests, `a test of ${alert}`).to.match(new RegExp(`alertname: ${alert}\\n\\s+exp_alerts:\\n\\s+- exp_labels`));
    for (const record of records) expect(tests, `a test of ${record}`).to.include(record);
  });

  it('fails a broken rule (the test really checks something)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'tally-rules-'));
    try {
      const rules = await readFile(join(RULES_DIR, 'tally.rules.yml'), 'utf8');
      await writeFile(join(dir, 'tally.rules.yml'), rules.replace('tally_oldest_unacked_age_seconds > 120', 'tally_oldest_unacked_age_seconds > 1200'));
      await writeFile(join(dir, 'tally.rules.test.yml'), await readFile(join(RULES_DIR, 'tally.rules.test.yml'), 'utf8'));
      const run = await runTool(requireTool('promtool', 'prometheus'), ['test', 'rules', 'tally.rules.test.yml'], { cwd: dir });
      expect(run.code).to.not.equal(0);
      expect(run.stdout + run.stderr).to.include('TallyStalled');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
