import { availableParallelism } from 'node:os';
import { expect } from 'chai';
import {
  DEFAULTS,
  LIMITS,
  loadConfig,
  loadFaultInjection,
  splitRedisUrls,
  TALLY_SETTINGS,
  unknownSettingError,
  type Env,
  type TallyConfig,
} from '../src/config.js';
import { ConfigError, TallyError } from '../src/errors.js';

function configError(env: Env): ConfigError {
  try {
    loadConfig(env);
    loadFaultInjection(env);
  } catch (error) {
    expect(error).to.be.instanceOf(ConfigError);
    expect(error).to.be.instanceOf(TallyError);
    return error as ConfigError;
  }
  return expect.fail(`expected a ConfigError for ${JSON.stringify(env)}`);
}

/** Every TALLY_* variable with values it must refuse. */
const BAD_VALUES: ReadonlyArray<readonly [variable: string, values: readonly string[]]> = [
  ['TALLY_AMQP_URL', ['http://user:s3cret@host', 'redis://127.0.0.1:6379', 'not a url', 'amqp//host', 'file:///etc/passwd']],
  ['TALLY_REDIS_URL', ['amqp://127.0.0.1:5672', 'http://localhost:6379', 'localhost:6379x', '127.0.0.1']],
  ['TALLY_QUEUE', ['amq.changes', 'q'.repeat(251), 'é'.repeat(126)]],
  ['TALLY_PREFIX', ['{tally}:', 'a{b', 'a}b', 'tally*', 'tal?y', 'x[1]', 'a b', 'back\\slash', '', 'p'.repeat(65), 'préfix']],
  ['TALLY_BATCH_MAX_CHANGES', ['0', '-5', '10000001', 'many', '1.5']],
  ['TALLY_FAULT_THREAD_EXIT_AFTER_WRITE', ['0', '-1', 'yes', '2.5']],
  ['TALLY_FAULT_KILL_AFTER_WRITE', ['0', '-1', 'yes', '2.5']],
  ['TALLY_FAULT_BUG', ['yes', 'THREAD', 'worker', 'main,thread']],
  ['TALLY_MODE', ['bogus', 'ATOMIC', 'TWO-STEP', 'two_step', 'atomic-mode']],
  ['TALLY_WORKERS', ['0', '65', '-1', 'four', '2.5', '1e1', '0x4']],
  ['TALLY_PREFETCH', ['0', '65536', 'lots', '10.0']],
  ['TALLY_BATCH_SIZE', ['0', '100001', '-5', '500ms']],
  ['TALLY_BATCH_WAIT_MS', ['-1', '60001', '50ms', '1.5']],
  ['TALLY_MARKER_TTL_S', ['0', '31536001', '600s', '99999999999999999999']],
  ['TALLY_MARKER_SUB_BUCKETS', ['0', '3', '100', '65537', '131072', '256.0', 'many']],
  ['TALLY_MARKER_CLAIM_TTL_S', ['0', '3601', '30s', '1.5']],
  ['TALLY_MARKER_SCOPE', ['messages', 'Part', 'shard']],
  ['TALLY_COUNT_TTL_S', ['0', '315360001', 'forever']],
  ['TALLY_ACCEPT_TYPES', [`sale,${'t'.repeat(65)}`]],
  ['TALLY_METRICS_PORT', ['65536', '-1', 'http', '9464.5']],
  ['TALLY_METRICS_HOST', ['http://0.0.0.0', '0.0.0.0:9464', 'a b', '-lead.example', '1.2.3.4/24']],
  ['TALLY_VIRTUAL_SHARDS', ['0', '1025', 'sixteen', '16.0', '-16']],
  ['TALLY_MAX_MESSAGE_BYTES', ['63', '16777217', '64k']],
  ['TALLY_SHUTDOWN_GRACE_MS', ['-1', '600001', '30s']],
  ['TALLY_STALL_MS', ['99', '3600001', '30s', '1.5']],
  ['TALLY_LOG_LEVEL', ['loud', 'verbose', 'INFO', 'warning']],
  ['TALLY_ALLOW_EVICTION', ['maybe', '2', 'on', 'y']],
  ['TALLY_REDIS_WAIT_REPLICAS', ['-1', '17', 'all', '1.0']],
  // 0 would make WAIT block forever.
  ['TALLY_REDIS_WAIT_TIMEOUT_MS', ['0', '60001', '5s', '-5']],
  ['TALLY_QUEUE_TYPE', ['stream', 'Quorum', 'CLASSIC', 'quorum,classic', 'lazy']],
  ['TALLY_DELIVERY_LIMIT', ['0', '-1', '1001', 'twenty', '2.5']],
  ['TALLY_HEARTBEAT_MS', ['99', '60001', '5s', '1.5']],
  ['TALLY_PARTITIONS', ['0', '1025', 'eight', '1.5']],
  ['TALLY_SOURCE', ['streams', 'Stream', 'queue,stream', 'log']],
  ['TALLY_STREAM_DEDUP', ['maybe', '2']],
  ['TALLY_MARKER_NATIVE_CLAIMS', ['maybe', 'off']],
  ['TALLY_STREAM_CHECKPOINT_MS', ['9', '600001', '1s']],
  ['TALLY_FAULT_STREAM_OVERLAP', ['both', '2']],
  // The declaration's own refusals are in message-mapping.test.ts.
  ['TALLY_MESSAGE_MAPPING', ['/eventId', '{}', '{"id":"eventId","changes":"/lines","sku":"0/sku","delta":"0/qty"}']],
];

describe('loadConfig', () => {
  it('fills every default from an empty environment', () => {
    const config = loadConfig({});
    const expected: TallyConfig = {
      amqpUrl: 'amqp://guest:guest@127.0.0.1:5672',
      amqpNodes: ['amqp://guest:guest@127.0.0.1:5672'],
      redisUrl: 'redis://127.0.0.1:6379',
      redisSeeds: ['redis://127.0.0.1:6379'],
      queue: 'inventory.changes',
      deadLetterQueue: 'inventory.changes.dead',
      queueType: 'classic',
      deliveryLimit: 20,
      heartbeatMs: 5_000,
      partitions: 1,
      prefix: 'tally:',
      source: 'queue',
      mode: 'two-step',
      streamDedup: true,
      checkpointMs: 1_000,
      workers: Math.min(Math.max(1, availableParallelism() - 1), 16),
      prefetch: 2000,
      batchSize: 500,
      batchMaxChanges: 5_000,
      batchWaitMs: 50,
      markerTtlS: 600,
      markerSubBuckets: 256,
      markerClaimTtlS: 10,
      markerNativeClaims: false,
      markerScope: null,
      countTtlS: 2_592_000,
      messageMapping: null,
      acceptTypes: null,
      metricsPort: null,
      metricsHost: '127.0.0.1',
      virtualShards: 16,
      maxMessageBytes: 65_536,
      shutdownGraceMs: 30_000,
      stallMs: 30_000,
      logLevel: 'info',
      allowEviction: false,
      redisWaitReplicas: 0,
      redisWaitTimeoutMs: 5_000,
    };
    expect(config).to.deep.equal(expected);
    expect(Object.isFrozen(config)).to.equal(true);
    expect(DEFAULTS.batchSize).to.equal(500);
  });

  it('treats empty and blank values as unset', () => {
    const env: Record<string, string> = {};
    for (const name of [
      'TALLY_AMQP_URL',
      'TALLY_REDIS_URL',
      'TALLY_QUEUE',
      'TALLY_MODE',
      'TALLY_WORKERS',
      'TALLY_BATCH_SIZE',
      'TALLY_METRICS_PORT',
      'TALLY_LOG_LEVEL',
      'TALLY_ACCEPT_TYPES',
    ]) {
      env[name] = '  ';
    }
    expect(loadConfig(env)).to.deep.equal(loadConfig({}));
  });

  it('reads TALLY_SOURCE=stream, and refuses TALLY_MODE beside it: a stream is exact by construction', () => {
    const stream = loadConfig({ TALLY_SOURCE: 'stream', TALLY_STREAM_DEDUP: 'false', TALLY_STREAM_CHECKPOINT_MS: '250' });
    expect(stream).to.include({ source: 'stream', streamDedup: false, checkpointMs: 250 });
    // Its own defaults for what is in flight, unless set.
    expect(stream).to.include({ prefetch: 16_000, batchSize: 2_000 });
    expect(loadConfig({ TALLY_SOURCE: 'stream', TALLY_PREFETCH: '300', TALLY_BATCH_SIZE: '50' })).to.include({ prefetch: 300, batchSize: 50 });
    for (const mode of ['two-step', 'atomic']) {
      let thrown: unknown = null;
      try {
        loadConfig({ TALLY_SOURCE: 'stream', TALLY_MODE: mode });
      } catch (error) {
        thrown = error;
      }
      expect((thrown as ConfigError | null)?.code, mode).to.equal('TALLY_CONFIG_INVALID');
      expect(String(thrown)).to.match(/^ConfigError: TALLY_MODE.*TALLY_SOURCE=stream/);
    }
    expect(loadConfig({ TALLY_SOURCE: 'queue', TALLY_MODE: 'atomic' }).mode).to.equal('atomic');
  });

  it('ignores variables outside TALLY_*', () => {
    expect(loadConfig({ AMQP_URL: 'http://x', TALLY: 'x', tally_workers: '999' })).to.deep.equal(loadConfig({}));
  });

  it('reads process.env when no environment is given', () => {
    const saved = process.env.TALLY_BATCH_SIZE;
    process.env.TALLY_BATCH_SIZE = '123';
    try {
      expect(loadConfig().batchSize).to.equal(123);
    } finally {
      if (saved === undefined) delete process.env.TALLY_BATCH_SIZE;
      else process.env.TALLY_BATCH_SIZE = saved;
    }
  });

  describe('rejects bad values with a ConfigError naming the variable', () => {
    for (const [variable, values] of BAD_VALUES) {
      for (const value of values) {
        it(`${variable}=${JSON.stringify(value.length > 40 ? `${value.slice(0, 12)}…(${value.length})` : value)}`, () => {
          const error = configError({ [variable]: value });
          expect(error.code).to.equal('TALLY_CONFIG_INVALID');
          expect(error.variable).to.equal(variable);
          expect(error.message.startsWith(`${variable}: `)).to.equal(true);
          expect(error.name).to.equal('ConfigError');
        });
      }
    }

    it('covers every Tally setting', () => {
      const covered = new Set(BAD_VALUES.map(([name]) => name));
      expect([...covered].sort()).to.deep.equal([...TALLY_SETTINGS].sort());
      expect(covered.size).to.equal(39);
    });

    it('names the accepted range for integers', () => {
      const error = configError({ TALLY_BATCH_SIZE: '0' });
      expect(error.message).to.include(String(LIMITS.batchSize[0])).and.include(String(LIMITS.batchSize[1]));
    });

    it('refuses TALLY_WORKERS above TALLY_VIRTUAL_SHARDS', () => {
      const error = configError({ TALLY_WORKERS: '8', TALLY_VIRTUAL_SHARDS: '4' });
      expect(error.code).to.equal('TALLY_CONFIG_INVALID');
      expect(error.variable).to.equal('TALLY_WORKERS');
      expect(error.message).to.include('TALLY_VIRTUAL_SHARDS');
      // Against the default of 16 virtual shards too.
      expect(configError({ TALLY_WORKERS: '17' }).variable).to.equal('TALLY_WORKERS');
    });

    it('names both modes when TALLY_MODE is neither', () => {
      const error = configError({ TALLY_MODE: 'exactly-once' });
      expect(error.variable).to.equal('TALLY_MODE');
      expect(error.message).to.include('atomic');
      expect(error.message).to.include('two-step');
    });
  });

  describe('rejects inconsistent cluster seed lists, naming the seed by position and never its password', () => {
    const cases: ReadonlyArray<readonly [string, RegExp]> = [
      ['redis://:s3cret@h1:7000,rediss://:s3cret@h2:7001', /seed 2 of 2 uses rediss:\/\/ but seed 1 uses redis:/],
      ['redis://:s3cret@h1:7000,redis://:other-s3cret@h2:7001', /seed 2 of 2 names other credentials/],
      ['redis://:s3cret@h1:7000,redis://h2:7001/3', /seed 2 of 2 names database "3"/],
      ['redis://:s3cret@h1:7000,http://h2:7001', /unsupported scheme|not a valid URL/],
      ['redis://:s3cret@h1:7000,redis://[::1:7001', /not a valid URL \(seed 2 of 2\)/],
      [',', /not a valid URL/],
    ];
    for (const [value, pattern] of cases) {
      it(value.replace(/s3cret/g, '…'), () => {
        const error = configError({ TALLY_REDIS_URL: value });
        expect(error.variable).to.equal('TALLY_REDIS_URL');
        expect(error.message).to.match(pattern);
        expect(error.message).not.to.include('s3cret');
      });
    }
    it('credentials on the first seed only, or repeated exactly, are accepted', () => {
      expect(loadConfig({ TALLY_REDIS_URL: 'redis://u:p@h1:1,redis://h2:2' }).redisSeeds).to.have.length(2);
      expect(loadConfig({ TALLY_REDIS_URL: 'redis://u:p@h1:1,redis://u:p@h2:2/0' }).redisSeeds).to.have.length(2);
    });
  });

  describe('rejects inconsistent broker node lists, naming the variable and the node by position, never its password', () => {
    const cases: ReadonlyArray<readonly [string, RegExp]> = [
      ['amqps://u:s3cret@h1:5671,amqp://u:s3cret@h2:5672', /node 2 of 2 uses amqp:\/\/ but node 1 uses amqps:/],
      ['amqp://u:s3cret@h1,amqp://u:other-s3cret@h2', /node 2 of 2 names other credentials/],
      ['amqp://u:s3cret@h1,amqp://h2', /node 2 of 2 names other credentials/],
      ['amqp://u:s3cret@h1,amqp://v:s3cret@h2', /node 2 of 2 names other credentials/],
      ['amqp://u:s3cret@h1/prod,amqp://u:s3cret@h2,amqp://u:s3cret@h3/prod', /node 2 of 3 names another vhost/],
      ['amqp://u:s3cret@h1,amqp://u:s3cret@[::1:5672', /not a valid URL \(node 2 of 2\)/],
      ['amqp://u:s3cret@h1, http://u:s3cret@h2', /not a valid URL/],
      ['amqp://u:s3cret@h1,amqp://u:s3cret@h2:99999', /not a valid URL \(node 2 of 2\)/],
      ['amqp://u:s3cret@h1,amqp://u:s3cret@h2,amqp:///vhost', /no host \(node 3 of 3\)|not a valid URL \(node 3 of 3\)/],
      [',', /expected an amqp:\/\/ or amqps:\/\/ URL|not a valid URL/],
    ];
    for (const [value, pattern] of cases) {
      it(value.replace(/s3cret/g, '…'), () => {
        const error = configError({ TALLY_AMQP_URL: value });
        expect(error.variable).to.equal('TALLY_AMQP_URL');
        expect(error.code).to.equal('TALLY_CONFIG_INVALID');
        expect(error.message).to.match(pattern);
        expect(error.message).not.to.include('s3cret');
      });
    }
  });

  describe('never echoes a password', () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ['TALLY_AMQP_URL', 'http://user:s3cret@host'],
      ['TALLY_AMQP_URL', 'amqp://user:s3cret@host:99999'],
      ['TALLY_AMQP_URL', 'amqp//user:s3cret@host'],
      ['TALLY_AMQP_URL', 'redis://user:s3cret@host'],
      ['TALLY_REDIS_URL', 'http://:s3cret@host:6379'],
      ['TALLY_REDIS_URL', 'amqp://user:s3cret@host'],
      ['TALLY_REDIS_URL', 'redis://user:s3cret@[::1'],
    ];
    for (const [variable, value] of cases) {
      it(`${variable}=${value}`, () => {
        const error = configError({ [variable]: value });
        expect(error.variable).to.equal(variable);
        expect(error.code).to.equal('TALLY_CONFIG_INVALID');
        expect(error.message).not.to.include('s3cret');
        expect(String(error.stack)).not.to.include('s3cret');
        expect(String(error)).not.to.include('s3cret');
      });
    }
  });

  describe('accepts good values', () => {
    it('amqps:// and rediss:// URLs, kept as given', () => {
      const config = loadConfig({ TALLY_AMQP_URL: 'amqps://u:p@broker.example:5671/vhost', TALLY_REDIS_URL: 'rediss://:p@cache.example:6380/2' });
      expect(config.amqpUrl).to.equal('amqps://u:p@broker.example:5671/vhost');
      expect(config.redisUrl).to.equal('rediss://:p@cache.example:6380/2');
    });

    it('schemes in any letter case, lowered so every consumer sees rediss:// and amqps:// (TLS), the rest untouched', () => {
      const config = loadConfig({ TALLY_AMQP_URL: 'AMQPS://U:P@Broker.example:5671/VHost', TALLY_REDIS_URL: 'ReDiSs://:PassWord@Cache.example:6380/2' });
      expect(config.amqpUrl).to.equal('amqps://U:P@Broker.example:5671/VHost');
      expect(config.redisUrl).to.equal('rediss://:PassWord@Cache.example:6380/2');
      expect(loadConfig({ TALLY_REDIS_URL: 'REDIS://h:1' }).redisUrl).to.equal('redis://h:1');
      expect(loadConfig({ TALLY_AMQP_URL: 'Amqp://h' }).amqpUrl).to.equal('amqp://h');
    });

    it('several comma-separated seed nodes of a cluster, each kept as given, schemes lowered', () => {
      const config = loadConfig({ TALLY_REDIS_URL: 'redis://:pw@10.0.0.1:7000, REDIS://10.0.0.2:7001,redis://:pw@[::1]:7002' });
      expect(config.redisSeeds).to.deep.equal(['redis://:pw@10.0.0.1:7000', 'redis://10.0.0.2:7001', 'redis://:pw@[::1]:7002']);
      expect(config.redisUrl).to.equal('redis://:pw@10.0.0.1:7000,redis://10.0.0.2:7001,redis://:pw@[::1]:7002');
      expect(Object.isFrozen(config.redisSeeds)).to.equal(true);
    });

    it('several comma-separated nodes of one RabbitMQ cluster, in the order given, schemes lowered', () => {
      const config = loadConfig({ TALLY_AMQP_URL: 'AMQPS://u:p@r1.example:5671/v, amqps://u:p@r2.example:5671/v,Amqps://u:p@[::1]:5671/v' });
      expect(config.amqpNodes).to.deep.equal(['amqps://u:p@r1.example:5671/v', 'amqps://u:p@r2.example:5671/v', 'amqps://u:p@[::1]:5671/v']);
      expect(config.amqpUrl).to.equal(config.amqpNodes.join(','));
      expect(Object.isFrozen(config.amqpNodes)).to.equal(true);
      // No credentials and no vhost on any node: guest and "/" on every one; "/" and "/%2F" are the same vhost.
      expect(loadConfig({ TALLY_AMQP_URL: 'amqp://h1,amqp://h2:5673' }).amqpNodes).to.have.length(2);
      expect(loadConfig({ TALLY_AMQP_URL: 'amqp://u:p@h1/%2F,amqp://u:p@h2,amqp://u:p@h3/' }).amqpNodes).to.have.length(3);
      expect(loadConfig({}).amqpNodes).to.deep.equal([DEFAULTS.amqpUrl]);
    });

    it('a comma inside a password does not split the URL', () => {
      const config = loadConfig({ TALLY_REDIS_URL: 'rediss://tally:a,b@cache.example:6380' });
      expect(config.redisSeeds).to.deep.equal(['rediss://tally:a,b@cache.example:6380']);
      expect(splitRedisUrls('redis://u:x,redis@h:1,redis://h:2')).to.deep.equal(['redis://u:x,redis@h:1', 'redis://h:2']);
    });

    it('TALLY_MARKER_NATIVE_CLAIMS: off unless set to a true word', () => {
      expect(loadConfig({ TALLY_MARKER_NATIVE_CLAIMS: 'no' }).markerNativeClaims).to.equal(false);
      expect(loadConfig({ TALLY_MARKER_NATIVE_CLAIMS: '1' }).markerNativeClaims).to.equal(true);
    });

    it('TALLY_ALLOW_EVICTION as 1/0, true/false, yes/no in any case', () => {
      for (const word of ['1', 'true', 'TRUE', 'yes', ' Yes ']) expect(loadConfig({ TALLY_ALLOW_EVICTION: word }).allowEviction, word).to.equal(true);
      for (const word of ['0', 'false', 'no', 'NO']) expect(loadConfig({ TALLY_ALLOW_EVICTION: word }).allowEviction, word).to.equal(false);
    });

    it('amqp:// and redis:// URLs with surrounding blanks trimmed', () => {
      const config = loadConfig({ TALLY_AMQP_URL: ' amqp://h ', TALLY_REDIS_URL: '\tredis://h:1\n' });
      expect(config.amqpUrl).to.equal('amqp://h');
      expect(config.redisUrl).to.equal('redis://h:1');
    });

    it('every integer at both ends of its range', () => {
      const names: Record<string, keyof typeof LIMITS> = {
        TALLY_PREFETCH: 'prefetch',
        TALLY_BATCH_SIZE: 'batchSize',
        TALLY_BATCH_MAX_CHANGES: 'batchMaxChanges',
        TALLY_BATCH_WAIT_MS: 'batchWaitMs',
        TALLY_MARKER_TTL_S: 'markerTtlS',
        TALLY_MARKER_SUB_BUCKETS: 'markerSubBuckets',
        TALLY_MARKER_CLAIM_TTL_S: 'markerClaimTtlS',
        TALLY_COUNT_TTL_S: 'countTtlS',
        TALLY_METRICS_PORT: 'metricsPort',
        TALLY_MAX_MESSAGE_BYTES: 'maxMessageBytes',
        TALLY_SHUTDOWN_GRACE_MS: 'shutdownGraceMs',
        TALLY_STALL_MS: 'stallMs',
        TALLY_REDIS_WAIT_REPLICAS: 'redisWaitReplicas',
        TALLY_REDIS_WAIT_TIMEOUT_MS: 'redisWaitTimeoutMs',
      };
      for (const [variable, key] of Object.entries(names)) {
        for (const value of LIMITS[key]) {
          const config = loadConfig({ [variable]: ` ${value} ` }) as unknown as Record<string, unknown>;
          expect(config[key], `${variable}=${value}`).to.equal(value);
        }
      }
      expect(loadConfig({ TALLY_VIRTUAL_SHARDS: '1024', TALLY_WORKERS: '64' })).to.include({ virtualShards: 1024, workers: 64 });
      expect(loadConfig({ TALLY_VIRTUAL_SHARDS: '1', TALLY_WORKERS: '1' })).to.include({ virtualShards: 1, workers: 1 });
    });

    it('workers equal to virtual shards, and a default worker count capped by the virtual shards', () => {
      expect(loadConfig({ TALLY_WORKERS: '4', TALLY_VIRTUAL_SHARDS: '4' }).workers).to.equal(4);
      expect(loadConfig({ TALLY_VIRTUAL_SHARDS: '1' }).workers).to.equal(1);
    });

    it('a queue name and its dead-letter queue', () => {
      const config = loadConfig({ TALLY_QUEUE: 'stock.moves' });
      expect(config.queue).to.equal('stock.moves');
      expect(config.deadLetterQueue).to.equal('stock.moves.dead');
      expect(loadConfig({ TALLY_QUEUE: 'q'.repeat(250) }).queue).to.have.length(250);
    });

    it('prefixes from the plain alphabet', () => {
      for (const prefix of ['t:', 'tally-prod.eu_1:', 'A', 'p'.repeat(64)]) {
        expect(loadConfig({ TALLY_PREFIX: prefix }).prefix).to.equal(prefix);
      }
    });

    it('TALLY_MODE=two-step and every log level', () => {
      expect(loadConfig({ TALLY_MODE: 'two-step' }).mode).to.equal('two-step');
      expect(loadConfig({ TALLY_MODE: 'atomic' }).mode).to.equal('atomic');
      expect(loadConfig({}).mode, 'the default').to.equal('two-step');
      for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']) {
        expect(loadConfig({ TALLY_LOG_LEVEL: level }).logLevel).to.equal(level);
      }
    });

    it('TALLY_QUEUE_TYPE classic or quorum, and TALLY_DELIVERY_LIMIT from 1 to 1000', () => {
      expect(loadConfig({ TALLY_QUEUE_TYPE: 'quorum' }).queueType).to.equal('quorum');
      expect(loadConfig({ TALLY_QUEUE_TYPE: 'classic' }).queueType).to.equal('classic');
      expect(configError({ TALLY_QUEUE_TYPE: 'stream' }).message).to.include('classic, quorum');
      expect(loadConfig({ TALLY_DELIVERY_LIMIT: '1' }).deliveryLimit).to.equal(1);
      expect(loadConfig({ TALLY_DELIVERY_LIMIT: '1000' }).deliveryLimit).to.equal(1000);
      expect(configError({ TALLY_DELIVERY_LIMIT: '0' }).message).to.include('from 1 to 1000');
    });

    it('TALLY_METRICS_PORT: null when unset, a number when set', () => {
      expect(loadConfig({}).metricsPort).to.equal(null);
      expect(loadConfig({ TALLY_METRICS_PORT: '9464' }).metricsPort).to.equal(9464);
      expect(loadConfig({ TALLY_METRICS_PORT: '0' }).metricsPort).to.equal(0);
    });

    it('TALLY_METRICS_HOST: loopback by default, any IP literal or host name', () => {
      expect(loadConfig({}).metricsHost).to.equal('127.0.0.1');
      for (const host of ['0.0.0.0', '::', '::1', '10.1.2.3', 'localhost', 'metrics.internal-1.example']) {
        expect(loadConfig({ TALLY_METRICS_HOST: host }).metricsHost).to.equal(host);
      }
    });
  });

  describe('TALLY_ACCEPT_TYPES', () => {
    it('is null (accept everything) when unset, empty or only commas', () => {
      for (const value of [undefined, '', '   ', ',', ' , ,, ']) {
        expect(loadConfig({ TALLY_ACCEPT_TYPES: value }).acceptTypes, JSON.stringify(value)).to.equal(null);
      }
    });

    it('splits on commas, trims, drops empties and duplicates', () => {
      const types = loadConfig({ TALLY_ACCEPT_TYPES: ' sale, return ,,restock,sale ' }).acceptTypes;
      expect(types).to.be.instanceOf(Set);
      expect([...types!].sort()).to.deep.equal(['restock', 'return', 'sale']);
    });

    it('is case-sensitive and accepts a single type and one of 64 characters', () => {
      expect([...loadConfig({ TALLY_ACCEPT_TYPES: 'Sale' }).acceptTypes!]).to.deep.equal(['Sale']);
      const long = 't'.repeat(64);
      expect([...loadConfig({ TALLY_ACCEPT_TYPES: long }).acceptTypes!]).to.deep.equal([long]);
    });
  });
});

/** The names loadConfig and loadFaultInjection read from `env`, recorded by a proxy in front of it. */
function namesRead(env: Record<string, string>): Set<string> {
  const names = new Set<string>();
  const recording = new Proxy(env, {
    get(target, name, receiver) {
      if (typeof name === 'string') names.add(name);
      return Reflect.get(target, name, receiver) as unknown;
    },
  });
  loadConfig(recording);
  loadFaultInjection(recording);
  return names;
}

describe('unknown TALLY_* variables', () => {
  function refusal(env: Env): ConfigError {
    const error = unknownSettingError(env);
    expect(error, JSON.stringify(env)).to.be.instanceOf(ConfigError);
    // loadConfig refuses with the very same error, before it reads anything else.
    expect(() => loadConfig(env)).to.throw(ConfigError, error!.message);
    return error!;
  }

  it('TALLY_SETTINGS holds exactly the variables loadConfig and loadFaultInjection read', () => {
    // Each environment takes another branch (a stream source, a metrics port, a fault): the union is every read.
    const read = new Set<string>();
    const envs: ReadonlyArray<Record<string, string>> = [
      {},
      { TALLY_SOURCE: 'stream' },
      { TALLY_METRICS_PORT: '9464', TALLY_FAULT_BUG: 'main', TALLY_FAULT_THREAD_EXIT_AFTER_WRITE: '1' },
    ];
    for (const env of envs) for (const name of namesRead(env)) read.add(name);
    expect([...read].sort()).to.deep.equal([...TALLY_SETTINGS].sort());
    expect(new Set(TALLY_SETTINGS).size, 'no setting twice').to.equal(TALLY_SETTINGS.length);
  });

  it('refuses a misspelled setting in one line naming it and the closest setting', () => {
    const error = refusal({ TALLY_MODEE: 'atomic' });
    expect(error.message).to.equal('TALLY_MODEE is not a Tally setting; did you mean TALLY_MODE?');
    expect(error.code).to.equal('TALLY_CONFIG_INVALID');
    expect(error.variable).to.equal('TALLY_MODEE');
  });

  it('suggests the nearest setting for a dropped, swapped or lower-case letter', () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ['TALLY_PREFX', 'TALLY_PREFIX'],
      ['TALLY_WROKERS', 'TALLY_WORKERS'],
      ['TALLY_BATCH_SIZ', 'TALLY_BATCH_SIZE'],
      ['TALLY_REDIS_WAIT_REPLICA', 'TALLY_REDIS_WAIT_REPLICAS'],
      ['TALLY_Mode', 'TALLY_MODE'],
      ['TALLY_MARKER_TTL', 'TALLY_MARKER_TTL_S'],
      ['TALLY_REDIS_URI', 'TALLY_REDIS_URL'],
      ['TALLY_AMQP_URI', 'TALLY_AMQP_URL'],
      ['TALLY_QUEUE_TYP', 'TALLY_QUEUE_TYPE'],
    ];
    for (const [typo, setting] of cases) {
      expect(refusal({ [typo]: '1' }).message, typo).to.equal(`${typo} is not a Tally setting; did you mean ${setting}?`);
    }
  });

  it('names the nearest setting without "did you mean" when none is close', () => {
    const error = refusal({ TALLY_FOO: 'bar' });
    expect(error.message).to.match(/^TALLY_FOO is not a Tally setting \(none is close; the nearest is TALLY_[A-Z_]+\)$/);
    expect(error.message).to.not.include('did you mean');
  });

  it('names every unknown variable, in one line', () => {
    const error = refusal({ TALLY_MODEE: 'atomic', TALLY_PREFETCH: '10', TALLY_BATCHSIZE: '5' });
    expect(error.variable).to.equal('TALLY_BATCHSIZE');
    expect(error.message).to.equal(
      'TALLY_BATCHSIZE is not a Tally setting; did you mean TALLY_BATCH_SIZE? TALLY_MODEE is not a Tally setting; did you mean TALLY_MODE?',
    );
    expect(error.message).to.not.include('\n');
  });

  it('refuses an unknown name set to an empty value, and ignores one present but undefined', () => {
    expect(refusal({ TALLY_MODEE: '' }).variable).to.equal('TALLY_MODEE');
    expect(unknownSettingError({ TALLY_MODEE: undefined })).to.equal(null);
  });

  it('leaves every known setting, OTEL_* and names outside TALLY_* alone', () => {
    const env = Object.fromEntries(TALLY_SETTINGS.map((name) => [name, 'x']));
    expect(unknownSettingError(env)).to.equal(null);
    expect(
      unknownSettingError({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_SPAN_LINK_COUNT_LIMIT: '1000', TALLY: 'x', tally_mode: 'atomic', MY_TALLY_MODE: 'x' }),
    ).to.equal(null);
  });
});

describe('loadFaultInjection', () => {
  it('is off unless TALLY_FAULT_THREAD_EXIT_AFTER_WRITE is set, and reads it as a positive count', () => {
    expect(loadFaultInjection({}).threadExitAfterWrite).to.equal(null);
    expect(loadFaultInjection({ TALLY_FAULT_THREAD_EXIT_AFTER_WRITE: '3' }).threadExitAfterWrite).to.equal(3);
  });

  it('kills the daemon in the window only when TALLY_FAULT_KILL_AFTER_WRITE is set, after that many count writes', () => {
    expect(loadFaultInjection({}).killAfterWrite).to.equal(null);
    expect(loadFaultInjection({ TALLY_FAULT_KILL_AFTER_WRITE: '4' }).killAfterWrite).to.equal(4);
  });

  it('injects no bug unless TALLY_FAULT_BUG names where: thread or main', () => {
    expect(loadFaultInjection({}).bug).to.equal(null);
    expect(loadFaultInjection({ TALLY_FAULT_BUG: 'thread' }).bug).to.equal('thread');
    expect(loadFaultInjection({ TALLY_FAULT_BUG: 'main' }).bug).to.equal('main');
  });

  it('makes stream daemons overlap only when TALLY_FAULT_STREAM_OVERLAP is on', () => {
    expect(loadFaultInjection({}).streamOverlap).to.equal(false);
    expect(loadFaultInjection({ TALLY_FAULT_STREAM_OVERLAP: '1' }).streamOverlap).to.equal(true);
  });
});
