import { expect } from 'chai';
import { tallyCli } from './fleet-helpers.js';
import { cleanup, runRefusedStart, startDaemon, stopDaemon, testSpace } from './harness.js';

describe('configuration errors (integration: the real entry point)', function () {
  this.timeout(120_000);

  const cases: Array<[string, string, RegExp]> = [
    ['TALLY_BATCH_SIZE', '0', /from 1 to 100000/],
    ['TALLY_BATCH_SIZE', 'lots', /integer/],
    ['TALLY_PREFETCH', '-5', /from 1 to 65535/],
    ['TALLY_MARKER_TTL_S', '1.5', /integer/],
    ['TALLY_MODE', 'three-step', /two-step/],
    ['TALLY_AMQP_URL', 'http://user:pw@host', /amqp:, amqps:/],
    ['TALLY_REDIS_URL', 'not a url', /redis/],
    ['TALLY_PREFIX', 'a{b}', /A-Za-z0-9/],
    ['TALLY_WORKERS', '99', /1 to 64/],
    ['TALLY_METRICS_PORT', '70000', /0 to 65535/],
  ];
  for (const [variable, value, accepted] of cases) {
    it(`refuses ${variable}=${JSON.stringify(value)} with exit 2 and a message naming the variable`, async () => {
      const space = testSpace('config');
      const { code, stderr } = await runRefusedStart({ ...space.env, [variable]: value });
      expect(code).to.equal(2);
      expect(stderr).to.include(variable);
      expect(stderr).to.match(accepted);
      expect(stderr.trim().split('\n'), 'one line').to.have.length(1);
    });
  }

  it('refuses a misspelled TALLY_* variable with exit 2, naming it and the setting meant, before anything starts', async () => {
    const space = testSpace('config');
    // Before this refusal, TALLY_MODEE=atomic started a two-step daemon without a word.
    const { code, stderr, logs } = await runRefusedStart({ ...space.env, TALLY_MODEE: 'atomic' });
    expect(code).to.equal(2);
    expect(stderr.trim()).to.equal('tally: configuration error: TALLY_MODEE is not a Tally setting; did you mean TALLY_MODE?');
    expect(logs, 'no log line: nothing started').to.deep.equal([]);
  });

  it('the CLI refuses a misspelled TALLY_* variable too, naming it, rather than reading the default', async () => {
    const space = testSpace('config');
    // TALLY_PREFX would otherwise read the counts of the default prefix `tally:` as if they were the prefix meant.
    const { code, stdout, stderr } = await tallyCli({ ...space.env, TALLY_PREFX: space.prefix }, 'counts', '--json');
    expect(code).to.equal(1);
    expect(stdout).to.equal('');
    expect(stderr.trim()).to.equal('tally: TALLY_PREFX is not a Tally setting; did you mean TALLY_PREFIX?');
  });

  it('never prints the password of a bad URL', async () => {
    const space = testSpace('config');
    const { code, stderr } = await runRefusedStart({ ...space.env, TALLY_REDIS_URL: 'http://admin:hunter2@example' });
    expect(code).to.equal(2);
    expect(stderr).to.include('TALLY_REDIS_URL');
    expect(stderr).to.not.include('hunter2');
  });

  it('refuses to start when the prefix was laid out with another number of virtual shards (invariant 3)', async () => {
    const space = testSpace('layout', { TALLY_VIRTUAL_SHARDS: '16' });
    try {
      const first = await startDaemon(space.env);
      expect((await stopDaemon(first)).code).to.equal(0);
      const { code, stderr } = await runRefusedStart({ ...space.env, TALLY_VIRTUAL_SHARDS: '32' });
      expect(code).to.equal(1);
      expect(stderr).to.include('TALLY_VIRTUAL_SHARDS');
      expect(stderr).to.include('16');
      // Different thread counts are fine: threads own shards, they do not define them.
      const again = await startDaemon({ ...space.env, TALLY_WORKERS: '1' });
      expect((await stopDaemon(again)).code).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });

  it('fails the start with a one-line reason when RabbitMQ refuses the credentials', async () => {
    const space = testSpace('auth');
    try {
      const { code, stderr } = await runRefusedStart({ ...space.env, TALLY_AMQP_URL: 'amqp://guest:wrong-password@127.0.0.1:5672' });
      expect(code).to.equal(1);
      expect(stderr).to.match(/refused/i);
      expect(stderr).to.not.include('wrong-password');
    } finally {
      await cleanup(space);
    }
  });
});
