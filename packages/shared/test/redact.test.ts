import { expect } from 'chai';
import { redactUrl } from '../src/redact.js';

describe('redactUrl', () => {
  const SECRET = 's3cr3t-Pa55';

  const cases: ReadonlyArray<readonly [input: string, expected: string]> = [
    [`amqp://user:${SECRET}@broker:5672/vhost`, 'amqp://user:***@broker:5672/vhost'],
    [`amqps://user:${SECRET}@broker:5671/%2F`, 'amqps://user:***@broker:5671/%2F'],
    [`redis://default:${SECRET}@cache:6379/0`, 'redis://default:***@cache:6379/0'],
    [`rediss://default:${SECRET}@cache:6380`, 'rediss://default:***@cache:6380'],
    [`redis://:${SECRET}@cache:6379`, 'redis://:***@cache:6379'],
    [`rediss://:${SECRET}@cache`, 'rediss://:***@cache'],
    [`redis://${SECRET}@cache:6379`, 'redis://***@cache:6379'],
    [`rediss://${SECRET}@cache`, 'rediss://***@cache'],
    [`amqp://guest:${SECRET}@127.0.0.1:5672?heartbeat=10`, 'amqp://guest:***@127.0.0.1:5672?heartbeat=10'],
  ];

  for (const [input, expected] of cases) {
    it(`hides the password of ${expected}`, () => {
      const out = redactUrl(input);
      expect(out).to.equal(expected);
      expect(out).not.to.include(SECRET);
    });
  }

  it('hides the password of every seed in a cluster list', () => {
    const out = redactUrl(`redis://:${SECRET}@n1:7000,redis://n2:7001, redis://tally:${SECRET}@n3:7002`);
    expect(out).to.equal('redis://:***@n1:7000,redis://n2:7001,redis://tally:***@n3:7002');
    expect(out).not.to.include(SECRET);
  });

  it('hides the password of every node in a broker node list', () => {
    const out = redactUrl(`amqps://tally:${SECRET}@r1:5671/v,amqps://tally:${SECRET}@r2:5671/v, AMQPS://tally:${SECRET}@r3:5671/v`);
    expect(out).to.equal('amqps://tally:***@r1:5671/v,amqps://tally:***@r2:5671/v,amqps://tally:***@r3:5671/v');
    expect(out).not.to.include(SECRET);
  });

  it('hides percent-encoded passwords', () => {
    for (const scheme of ['amqp', 'amqps', 'redis', 'rediss']) {
      const out = redactUrl(`${scheme}://user:p%40ss%3Aword@host:1234`);
      expect(out).to.equal(`${scheme}://user:***@host:1234`);
      expect(out).not.to.include('p%40ss');
      expect(out).not.to.include('word');
    }
  });

  it('leaves URLs without credentials as they are', () => {
    for (const url of ['amqp://127.0.0.1:5672', 'redis://127.0.0.1:6379', 'rediss://cache.example:6380/2', 'amqps://broker.example/vhost']) {
      expect(redactUrl(url)).to.equal(url);
    }
  });

  it('keeps an AMQP user name without a password (it is not a secret there)', () => {
    expect(redactUrl('amqp://guest@broker:5672')).to.equal('amqp://guest@broker:5672');
  });

  it('strips the userinfo of a string that does not parse as a URL', () => {
    const out = redactUrl(`amqp://user:${SECRET}@broker:99999`);
    expect(out).not.to.include(SECRET);
    expect(out).to.equal('amqp://***@broker:99999');
  });

  it('is idempotent', () => {
    for (const [input] of cases) {
      const once = redactUrl(input);
      expect(redactUrl(once)).to.equal(once);
    }
  });

  it('never returns a password it was given, for many passwords and schemes', () => {
    const passwords = ['x', 'hunter2', 'p4ss-w0rd', 'LONG'.repeat(20), '%F0%9F%98%80', 'a~b_c.d!e$f'];
    for (const scheme of ['amqp', 'amqps', 'redis', 'rediss']) {
      for (const password of passwords) {
        for (const url of [`${scheme}://user:${password}@host:1`, `${scheme}://:${password}@host`]) {
          const out = redactUrl(url);
          expect(out.split('@')[0], url).not.to.include(password);
        }
      }
    }
  });
});
