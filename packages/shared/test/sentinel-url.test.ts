import { expect } from 'chai';
import { loadConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';
import { redactUrl } from '../src/redact.js';
import { isSentinelUrl, parseSentinelUrl } from '../src/sentinel-url.js';

const SECRET = 's3cr3t-Pa55';

function refusal(value: string): ConfigError {
  try {
    loadConfig({ TALLY_REDIS_URL: value });
  } catch (error) {
    expect(error).to.be.instanceOf(ConfigError);
    return error as ConfigError;
  }
  return expect.fail(`expected ${value} to be refused`);
}

describe('redis+sentinel:// (sentinel-url.ts)', () => {
  it('reads the Sentinels, the master name, both credentials, the database and TLS', () => {
    const target = parseSentinelUrl(`rediss+sentinel://tally:${SECRET}@s1:26380,s2,[::1]:26381/orders/2?sentinelPassword=${SECRET}x&sentinelUsername=watch`);
    expect(target).to.deep.equal({
      tls: true,
      sentinels: [
        { host: 's1', port: 26380 },
        { host: 's2', port: 26379 },
        { host: '::1', port: 26381 },
      ],
      masterName: 'orders',
      db: 2,
      username: 'tally',
      password: SECRET,
      sentinelUsername: 'watch',
      sentinelPassword: `${SECRET}x`,
    });
  });

  it('defaults: no credentials, database 0, plaintext; percent-encoding decoded', () => {
    expect(parseSentinelUrl('redis+sentinel://127.0.0.1:26379/mymaster')).to.include({
      tls: false,
      db: 0,
      username: null,
      password: null,
      sentinelPassword: null,
    });
    const encoded = parseSentinelUrl('redis+sentinel://:p%40ss%2Fw%3Ard@h/my%20master?sentinelPassword=a%26b');
    expect(encoded).to.include({ username: null, password: 'p@ss/w:rd', masterName: 'my master', sentinelPassword: 'a&b' });
  });

  it('is told apart from redis:// and rediss:// in any case', () => {
    expect(isSentinelUrl('REDIS+SENTINEL://h/m')).to.equal(true);
    expect(isSentinelUrl('rediss+sentinel://h/m')).to.equal(true);
    expect(isSentinelUrl('redis://h:6379')).to.equal(false);
    expect(isSentinelUrl('rediss://h:6379,redis+sentinel://h/m')).to.equal(false);
  });

  it('TALLY_REDIS_URL accepts it, the scheme lower-cased, as one seed', () => {
    const config = loadConfig({ TALLY_REDIS_URL: 'REDIS+Sentinel://h1:1,h2:2/m' });
    expect(config.redisUrl).to.equal('redis+sentinel://h1:1,h2:2/m');
    expect(config.redisSeeds).to.deep.equal(['redis+sentinel://h1:1,h2:2/m']);
  });

  describe('refuses, naming TALLY_REDIS_URL and never a password', () => {
    const cases: ReadonlyArray<readonly [string, RegExp]> = [
      [`redis+sentinel://:${SECRET}@h1:26379`, /no master name/],
      [`redis+sentinel://:${SECRET}@h1:26379/`, /no master name/],
      [`redis+sentinel://:${SECRET}@h1:99999/m`, /port 99999 out of range/],
      [`redis+sentinel://:${SECRET}@h1,,h2/m`, /empty Sentinel address \(Sentinel 2 of 3\)/],
      [`redis+sentinel://:${SECRET}@/m`, /empty Sentinel address/],
      [`redis+sentinel://:${SECRET}@h1:port/m`, /not a host or host:port/],
      [`redis+sentinel://:${SECRET}@h1/m/x`, /database "x" is not a number/],
      [`redis+sentinel://:${SECRET}@h1/m/1/2`, /too many path segments/],
      [`redis+sentinel://:${SECRET}@h1/m?sentinelpassword=${SECRET}`, /unknown parameter "sentinelpassword" \(known: sentinelUsername, sentinelPassword\)/],
      [`redis+sentinel://:${SECRET}@h1/m?sentinelPassword=a&sentinelPassword=b`, /given twice/],
      [`redis+sentinel://:%E0%A4%A@h1/m`, /password is not valid percent-encoding/],
      [`redis+sentinel://:${SECRET}@h1/m#frag`, /fragment/],
      [`sentinel://:${SECRET}@h1/m`, /unsupported scheme|not a valid URL/],
    ];
    for (const [value, pattern] of cases) {
      it(value.replaceAll(SECRET, '…'), () => {
        const error = refusal(value);
        expect(error.variable).to.equal('TALLY_REDIS_URL');
        expect(error.message).to.match(pattern);
        expect(error.message).not.to.include(SECRET);
      });
    }
  });

  describe('redactUrl', () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      [`redis+sentinel://tally:${SECRET}@s1:26379,s2:26379/m`, 'redis+sentinel://tally:***@s1:26379,s2:26379/m'],
      [`rediss+sentinel://:${SECRET}@s1/m/3?sentinelPassword=${SECRET}`, 'rediss+sentinel://:***@s1:26379/m/3?sentinelPassword=***'],
      [`redis+sentinel://${SECRET}@s1/m`, 'redis+sentinel://***@s1:26379/m'],
      [
        `redis+sentinel://s1,[::1]:26380/m?sentinelUsername=w&sentinelPassword=${SECRET}`,
        'redis+sentinel://s1:26379,[::1]:26380/m?sentinelUsername=w&sentinelPassword=***',
      ],
      // Unparseable (an unencoded / in the password): masked whole rather than guessed at.
      [`redis+sentinel://u:${SECRET}/x@s1/m`, 'redis+sentinel://***'],
    ];
    for (const [input, expected] of cases) {
      it(`hides the passwords of ${expected}`, () => {
        const out = redactUrl(input);
        expect(out).to.equal(expected);
        expect(out).not.to.include(SECRET);
      });
    }
  });
});
