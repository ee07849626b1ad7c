import { expect } from 'chai';
import {
  assessRedis,
  classifyRedisFailure,
  factsFromInfo,
  MIN_REDIS_VERSION,
  parseInfo,
  parseVersion,
  requirementError,
  versionAtLeast,
  type RedisFacts,
} from '../src/redis-requirements.js';
import { RedisRequirementError, TallyError } from '../src/errors.js';

/** INFO as a Redis 7 server writes it (CRLF, section headers), with the fields the probe reads. */
function fakeInfo(fields: Record<string, string | number>): string {
  const base: Record<string, string | number> = {
    redis_version: '7.0.15',
    redis_mode: 'standalone',
    maxmemory: 0,
    maxmemory_policy: 'noeviction',
    loading: 0,
    aof_enabled: 1,
    role: 'master',
    connected_slaves: 0,
    cluster_enabled: 0,
    ...fields,
  };
  const sections: Record<string, string[]> = {
    Server: ['redis_version', 'redis_mode'],
    Memory: ['maxmemory', 'maxmemory_policy'],
    Persistence: ['loading', 'aof_enabled'],
    Replication: ['role', 'connected_slaves'],
    Cluster: ['cluster_enabled'],
  };
  let text = '';
  for (const [section, names] of Object.entries(sections)) {
    text += `# ${section}\r\n`;
    for (const name of names) if (base[name] !== undefined && base[name] !== '') text += `${name}:${base[name]}\r\n`;
    text += '\r\n';
  }
  return text;
}

const SAFE: RedisFacts = factsFromInfo(fakeInfo({}));
const DEFAULT_SETTINGS = { allowEviction: false, waitReplicas: 0 };

describe('redis requirements (pure decisions of the start-up probe)', () => {
  describe('parseInfo / factsFromInfo', () => {
    it('reads fields across sections, ignoring headers and blank lines', () => {
      const info = parseInfo('# Server\r\nredis_version:7.2.4\r\nos:Linux 6.1:x86_64\r\n\r\n# Memory\r\nmaxmemory_policy:allkeys-lru\r\n');
      expect(info.get('redis_version')).to.equal('7.2.4');
      // Values may contain colons.
      expect(info.get('os')).to.equal('Linux 6.1:x86_64');
      expect(info.get('maxmemory_policy')).to.equal('allkeys-lru');
      expect(info.has('# Server')).to.equal(false);
    });

    it('turns INFO into facts', () => {
      expect(factsFromInfo(fakeInfo({ aof_enabled: 0, connected_slaves: 2, cluster_enabled: 1, maxmemory_policy: 'volatile-ttl', loading: 1 }))).to.deep.equal({
        version: '7.0.15',
        maxmemoryPolicy: 'volatile-ttl',
        aofEnabled: false,
        connectedReplicas: 2,
        clusterEnabled: true,
        loading: true,
      });
    });

    it("prefers CONFIG GET's policy over INFO's", () => {
      expect(factsFromInfo(fakeInfo({ maxmemory_policy: 'noeviction' }), 'allkeys-lfu').maxmemoryPolicy).to.equal('allkeys-lfu');
    });

    it('missing fields are unknown, not safe', () => {
      const facts = factsFromInfo('# Server\r\n');
      expect(facts.version).to.equal(null);
      expect(facts.maxmemoryPolicy).to.equal(null);
      expect(facts.aofEnabled).to.equal(false);
      expect(facts.connectedReplicas).to.equal(0);
    });
  });

  describe('version', () => {
    it(`needs ${MIN_REDIS_VERSION.join('.')} or newer`, () => {
      expect(parseVersion('7.0.15')).to.deep.equal([7, 0, 15]);
      expect(parseVersion('6.2')).to.deep.equal([6, 2, 0]);
      expect(parseVersion('255.255.255')).to.deep.equal([255, 255, 255]);
      expect(parseVersion('unstable')).to.equal(null);
      expect(versionAtLeast([7, 0, 0], MIN_REDIS_VERSION)).to.equal(true);
      expect(versionAtLeast([7, 2, 4], MIN_REDIS_VERSION)).to.equal(true);
      expect(versionAtLeast([8, 0, 0], MIN_REDIS_VERSION)).to.equal(true);
      expect(versionAtLeast([6, 2, 14], MIN_REDIS_VERSION)).to.equal(false);
      expect(versionAtLeast([6, 9, 99], MIN_REDIS_VERSION)).to.equal(false);
    });

    for (const old of ['6.2.14', '6.0.20', '5.0.14', '2.8.24', 'unstable']) {
      it(`refuses Redis ${old} with TALLY_REDIS_VERSION naming the minimum`, () => {
        const { fatal } = assessRedis(factsFromInfo(fakeInfo({ redis_version: old })), DEFAULT_SETTINGS);
        expect(fatal.map((p) => p.code)).to.deep.equal(['TALLY_REDIS_VERSION']);
        expect(fatal[0]!.message).to.include(old).and.include('7.0.0');
      });
    }

    for (const good of ['7.0.0', '7.0.15', '7.2.4', '7.4.1', '8.0.2']) {
      it(`accepts Redis ${good}`, () => {
        expect(assessRedis(factsFromInfo(fakeInfo({ redis_version: good })), DEFAULT_SETTINGS).fatal).to.deep.equal([]);
      });
    }

    it('an unreported version is a warning (the script probe still checks what the scripts need)', () => {
      const { fatal, warnings } = assessRedis(factsFromInfo(fakeInfo({ redis_version: '' })), DEFAULT_SETTINGS);
      expect(fatal).to.deep.equal([]);
      expect(warnings.map((w) => w.code)).to.include('TALLY_REDIS_UNKNOWN');
    });
  });

  describe('maxmemory-policy', () => {
    it('a safe server has no problem and no warning', () => {
      expect(assessRedis(SAFE, DEFAULT_SETTINGS)).to.deep.equal({ fatal: [], warnings: [] });
    });

    for (const policy of ['allkeys-lru', 'allkeys-lfu', 'allkeys-random', 'volatile-lru', 'volatile-lfu', 'volatile-random', 'volatile-ttl']) {
      it(`refuses ${policy}, naming maxmemory-policy, the policy and both fixes`, () => {
        const { fatal } = assessRedis({ ...SAFE, maxmemoryPolicy: policy }, DEFAULT_SETTINGS);
        expect(fatal).to.have.length(1);
        expect(fatal[0]!.code).to.equal('TALLY_REDIS_EVICTION_POLICY');
        expect(fatal[0]!.message).to.include('maxmemory-policy').and.include(policy);
        expect(fatal[0]!.message).to.include('CONFIG SET maxmemory-policy noeviction').and.include('TALLY_ALLOW_EVICTION=1');
        expect(fatal[0]!.message).not.to.include('\n');
      });
    }

    it('TALLY_ALLOW_EVICTION turns the refusal into a warning', () => {
      const { fatal, warnings } = assessRedis({ ...SAFE, maxmemoryPolicy: 'allkeys-lru' }, { ...DEFAULT_SETTINGS, allowEviction: true });
      expect(fatal).to.deep.equal([]);
      expect(warnings.map((w) => w.code)).to.deep.equal(['TALLY_REDIS_EVICTION_ALLOWED']);
      expect(warnings[0]!.message).to.include('allkeys-lru').and.include('TALLY_ALLOW_EVICTION');
    });

    it('an unreadable policy is a warning', () => {
      const { fatal, warnings } = assessRedis({ ...SAFE, maxmemoryPolicy: null }, DEFAULT_SETTINGS);
      expect(fatal).to.deep.equal([]);
      expect(warnings.map((w) => w.code)).to.deep.equal(['TALLY_REDIS_UNKNOWN']);
    });
  });

  describe('durability (warnings: the data is at risk, nothing is wrong yet)', () => {
    it('warns when neither AOF nor a replica protects the data, naming both remedies', () => {
      const { fatal, warnings } = assessRedis({ ...SAFE, aofEnabled: false, connectedReplicas: 0 }, DEFAULT_SETTINGS);
      expect(fatal).to.deep.equal([]);
      expect(warnings.map((w) => w.code)).to.deep.equal(['TALLY_REDIS_NOT_DURABLE']);
      expect(warnings[0]!.message).to.include('appendonly').and.include('TALLY_REDIS_WAIT_REPLICAS');
    });

    it('AOF alone, or a replica alone, is protection', () => {
      expect(assessRedis({ ...SAFE, aofEnabled: true, connectedReplicas: 0 }, DEFAULT_SETTINGS).warnings).to.deep.equal([]);
      expect(assessRedis({ ...SAFE, aofEnabled: false, connectedReplicas: 1 }, DEFAULT_SETTINGS).warnings).to.deep.equal([]);
    });

    it('warns when TALLY_REDIS_WAIT_REPLICAS exceeds the connected replicas', () => {
      const { fatal, warnings } = assessRedis({ ...SAFE, connectedReplicas: 1 }, { ...DEFAULT_SETTINGS, waitReplicas: 2 });
      expect(fatal).to.deep.equal([]);
      expect(warnings.map((w) => w.code)).to.deep.equal(['TALLY_REDIS_FEW_REPLICAS']);
      expect(warnings[0]!.message).to.include('TALLY_REDIS_WAIT_REPLICAS is 2').and.include('1 connected');
      expect(assessRedis({ ...SAFE, connectedReplicas: 2 }, { ...DEFAULT_SETTINGS, waitReplicas: 2 }).warnings).to.deep.equal([]);
    });
  });

  describe('cluster', () => {
    it('a cluster node is not a problem: the probe detects the cluster and uses the cluster client', () => {
      const { fatal, warnings } = assessRedis({ ...SAFE, clusterEnabled: true }, DEFAULT_SETTINGS);
      expect(fatal).to.deep.equal([]);
      expect(warnings).to.deep.equal(assessRedis(SAFE, DEFAULT_SETTINGS).warnings);
    });

    it('several problems are all reported, the first one stops the start', () => {
      const { fatal } = assessRedis({ ...SAFE, version: '6.2.0', clusterEnabled: true, maxmemoryPolicy: 'allkeys-lru' }, DEFAULT_SETTINGS);
      expect(fatal.map((p) => p.code)).to.deep.equal(['TALLY_REDIS_VERSION', 'TALLY_REDIS_EVICTION_POLICY']);
      const error = requirementError(fatal)!;
      expect(error).to.be.instanceOf(RedisRequirementError).and.instanceOf(TallyError);
      expect(error.code).to.equal('TALLY_REDIS_VERSION');
      expect(requirementError([])).to.equal(null);
    });
  });

  describe('classifyRedisFailure', () => {
    it("a cluster's redirections and failover replies are outages (null), waited out, never a refusal", () => {
      for (const message of [
        'MOVED 3999 127.0.0.1:7001',
        'ASK 3999 127.0.0.1:7001',
        'TRYAGAIN Multiple keys request during rehashing of slot',
        'CLUSTERDOWN The cluster is down',
      ]) {
        expect(classifyRedisFailure({ message }), message).to.equal(null);
      }
    });

    const cases: Array<[string, { message?: string; code?: string }, string, RegExp]> = [
      ['wrong password', { message: 'WRONGPASS invalid username-password pair or user is disabled.' }, 'TALLY_REDIS_AUTH', /TALLY_REDIS_URL/],
      ['no password', { message: 'NOAUTH Authentication required.' }, 'TALLY_REDIS_AUTH', /TALLY_REDIS_URL/],
      ['old-style wrong password', { message: 'ERR invalid password' }, 'TALLY_REDIS_AUTH', /password/],
      ['ACL: no scripting', { message: "NOPERM this user has no permissions to run the 'evalsha' command" }, 'TALLY_REDIS_NOPERM', /\+@scripting/],
      ['ACL: key pattern', { message: 'NOPERM No permissions to access a key' }, 'TALLY_REDIS_NOPERM', /~<TALLY_PREFIX>\*/],
      ['renamed EVALSHA', { message: "ERR unknown command 'evalsha', with args beginning with: " }, 'TALLY_REDIS_SCRIPTING', /EVALSHA/],
      ['renamed SCRIPT', { message: "ERR unknown command 'SCRIPT', with args beginning with: 'LOAD'" }, 'TALLY_REDIS_SCRIPTING', /scripting/],
      [
        'shebang on an old server',
        { message: "ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'" },
        'TALLY_REDIS_SCRIPTING',
        /7\.0\.0/,
      ],
      [
        'untrusted CA',
        { message: 'self-signed certificate in certificate chain', code: 'SELF_SIGNED_CERT_IN_CHAIN' },
        'TALLY_REDIS_TLS',
        /NODE_EXTRA_CA_CERTS/,
      ],
      [
        'unknown issuer',
        { message: 'unable to verify the first certificate', code: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' },
        'TALLY_REDIS_TLS',
        /NODE_EXTRA_CA_CERTS/,
      ],
      ['expired', { message: 'certificate has expired', code: 'CERT_HAS_EXPIRED' }, 'TALLY_REDIS_TLS', /CERT_HAS_EXPIRED/],
      ['wrong host', { message: "Hostname/IP does not match certificate's altnames", code: 'ERR_TLS_CERT_ALTNAME_INVALID' }, 'TALLY_REDIS_TLS', /host/],
      [
        'TLS to a plaintext port',
        { message: 'error:0A00010B:SSL routines::wrong version number', code: 'ERR_SSL_WRONG_VERSION_NUMBER' },
        'TALLY_REDIS_TLS',
        /tls-port/,
      ],
    ];
    for (const [label, error, code, fix] of cases) {
      it(`${label} -> ${code}, one line naming the fix`, () => {
        const problem = classifyRedisFailure(error, 'EVALSHA')!;
        expect(problem, label).to.not.equal(null);
        expect(problem.code).to.equal(code);
        expect(problem.message).to.match(fix);
        expect(problem.message).not.to.match(/[\r\n]/);
      });
    }

    const outages: Array<[string, { message?: string; code?: string }]> = [
      ['connection refused', { message: 'connect ECONNREFUSED 127.0.0.1:6379', code: 'ECONNREFUSED' }],
      ['closed', { message: 'Connection is closed.' }],
      ['timeout', { message: 'Command timed out' }],
      ['loading', { message: 'LOADING Redis is loading the dataset in memory' }],
      ['OOM', { message: "OOM command not allowed when used memory > 'maxmemory'." }],
      ['reset', { message: 'read ECONNRESET', code: 'ECONNRESET' }],
    ];
    for (const [label, error] of outages) {
      it(`${label} is an outage (null): waited out, not fatal`, () => {
        expect(classifyRedisFailure(error)).to.equal(null);
      });
    }
    it('nothing to classify', () => {
      expect(classifyRedisFailure(null)).to.equal(null);
      expect(classifyRedisFailure(undefined)).to.equal(null);
    });
  });
});
