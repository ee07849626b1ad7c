/**
 * The start-up probe against real redis-servers configured the wrong way
 * (an evicting policy, wrong credentials, a narrow ACL): each one stops the real daemon with exit 1 and one
 * stderr line naming the fix, instead of a retry loop on "redis unavailable".
 * The Redis version rule is unit-tested with fake INFO (shared), since only
 * Redis 7 is installed here.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { readCounts } from '../../src/commands/counts.js';
import {
  cleanup,
  compare,
  runRefusedStart,
  spawnDaemon,
  startDaemon,
  stopDaemon,
  testSpace,
  waitForReadyEmpty,
  AMQP_URL,
  type DaemonProcess,
  type RefusedStart,
} from './harness.js';
import { asAdmin, freePort, startPrivateRedis, type PrivateRedis } from '@tally/testkit';

function expectOneLineRefusal(result: RefusedStart, code: string, ...mentions: string[]): void {
  expect(result.code, `exit code; stderr: ${result.stderrLines.join('|')}`).to.equal(1);
  expect(result.stderrLines, 'exactly one stderr line').to.have.length(1);
  for (const text of mentions) expect(result.stderrLines[0]).to.include(text);
  expect(result.stderrLines[0]).not.to.match(/\bat .*\.js:\d+/); // no stack trace
  expect(result.fatalCode).to.equal(code);
  expect(
    result.logs.some((l) => l.includes('redis unavailable; retrying')),
    'not a retry loop',
  ).to.equal(false);
}

function redisUrl(server: PrivateRedis, userInfo = ''): string {
  return `redis://${userInfo}127.0.0.1:${server.port}`;
}

describe('redis start-up probe (integration: private redis-servers, the real daemon)', function () {
  this.timeout(180_000);
  const servers: PrivateRedis[] = [];
  const daemons: DaemonProcess[] = [];
  async function server(settings: Parameters<typeof startPrivateRedis>[0]): Promise<PrivateRedis> {
    const started = await startPrivateRedis(settings);
    servers.push(started);
    return started;
  }
  afterEach(async () => {
    for (const daemon of daemons.splice(0)) await stopDaemon(daemon);
    for (const started of servers.splice(0)) await started.stop();
  });

  describe('case 1: an evicting Redis', () => {
    it('refuses maxmemory-policy allkeys-lru, naming maxmemory-policy, the policy and the fix', async () => {
      const redis = await server({ args: ['--maxmemory-policy', 'allkeys-lru'] });
      const space = testSpace('evict', { TALLY_REDIS_URL: redisUrl(redis) });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(
        result,
        'TALLY_REDIS_EVICTION_POLICY',
        'maxmemory-policy',
        'allkeys-lru',
        'CONFIG SET maxmemory-policy noeviction',
        'TALLY_ALLOW_EVICTION=1',
      );
      // Nothing was written before the refusal.
      expect(await asAdmin(redis, (admin) => admin.dbsize())).to.equal(0);
    });

    it('refuses volatile-ttl too, read from INFO when CONFIG is renamed away', async () => {
      const redis = await server({ args: ['--maxmemory-policy', 'volatile-ttl', '--rename-command', 'CONFIG', ''] });
      const space = testSpace('evict', { TALLY_REDIS_URL: redisUrl(redis) });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_EVICTION_POLICY', 'maxmemory-policy', 'volatile-ttl');
    });

    it('TALLY_ALLOW_EVICTION=1 starts with a warning and the gauge tally_redis_eviction_allowed 1', async () => {
      const redis = await server({ args: ['--maxmemory-policy', 'allkeys-lru'] });
      const space = testSpace('evict', { TALLY_REDIS_URL: redisUrl(redis), TALLY_ALLOW_EVICTION: '1', TALLY_METRICS_PORT: '0' });
      try {
        const daemon = await startDaemon(space.env);
        daemons.push(daemon);
        const warning = JSON.parse(daemon.logs.find((l) => l.includes('TALLY_REDIS_EVICTION_ALLOWED'))!) as { level: number; msg: string };
        expect(warning.level).to.equal(40);
        expect(warning.msg).to.include('allkeys-lru');
        const { port } = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number };
        const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
        expect(metrics).to.match(/^tally_redis_eviction_allowed\{[^}]*tally_redis_maxmemory_policy="allkeys-lru"[^}]*\} 1$/m);
        const ready = (await (await fetch(`http://127.0.0.1:${port}/readyz`)).json()) as { redis: { evictionAllowed: boolean; maxmemoryPolicy: string } };
        expect(ready.redis).to.include({ evictionAllowed: true, maxmemoryPolicy: 'allkeys-lru' });
      } finally {
        await cleanup(space);
      }
    });
  });

  describe('case 2: durability warnings', () => {
    it('warns when neither AOF nor a replica protects the data, naming TALLY_REDIS_WAIT_REPLICAS and appendonly', async () => {
      const redis = await server({});
      const space = testSpace('durable', { TALLY_REDIS_URL: redisUrl(redis), TALLY_METRICS_PORT: '0' });
      try {
        const daemon = await startDaemon(space.env);
        daemons.push(daemon);
        const warning = daemon.logs.find((l) => l.includes('TALLY_REDIS_NOT_DURABLE'));
        expect(warning).to.be.a('string');
        expect(warning).to.include('TALLY_REDIS_WAIT_REPLICAS').and.include('appendonly');
        const { port } = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number };
        expect(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()).to.match(/^tally_redis_unprotected\{[^}]*\} 1$/m);
      } finally {
        await cleanup(space);
      }
    });

    it('with AOF on there is no durability warning', async () => {
      const redis = await server({ args: ['--appendonly', 'yes'] });
      const space = testSpace('durable', { TALLY_REDIS_URL: redisUrl(redis) });
      try {
        const daemon = await startDaemon(space.env);
        daemons.push(daemon);
        expect(daemon.logs.filter((l) => l.includes('TALLY_REDIS_'))).to.deep.equal([]);
      } finally {
        await cleanup(space);
      }
    });

    it('with a replica: no durability warning, but TALLY_REDIS_WAIT_REPLICAS above the replicas connected warns', async () => {
      const primary = await server({});
      const replica = await server({ args: ['--replicaof', '127.0.0.1', '0'] });
      await asAdmin(replica, (admin) => admin.replicaof('127.0.0.1', primary.port));
      const deadline = Date.now() + 20_000;
      while (!/connected_slaves:1/.test(await asAdmin(primary, (admin) => admin.info('replication')))) {
        if (Date.now() > deadline) throw new Error('replica did not connect');
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      const space = testSpace('replicas', { TALLY_REDIS_URL: redisUrl(primary), TALLY_REDIS_WAIT_REPLICAS: '2' });
      try {
        const daemon = await startDaemon(space.env);
        daemons.push(daemon);
        expect(daemon.logs.some((l) => l.includes('TALLY_REDIS_NOT_DURABLE'))).to.equal(false);
        const warning = daemon.logs.find((l) => l.includes('TALLY_REDIS_FEW_REPLICAS'));
        expect(warning).to.include('TALLY_REDIS_WAIT_REPLICAS is 2').and.include('1 connected');
      } finally {
        await cleanup(space);
      }
    });
  });

  describe('case 3: the rest of the probe', () => {
    it('a wrong password: TALLY_REDIS_AUTH naming TALLY_REDIS_URL, the password never printed', async () => {
      const redis = await server({ password: 'right-secret' });
      const space = testSpace('auth', { TALLY_REDIS_URL: redisUrl(redis, ':wrong-secret@') });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_AUTH', 'TALLY_REDIS_URL', 'WRONGPASS');
      expect(result.stderrLines[0]).not.to.include('secret');
      expect(result.logs.join('\n')).not.to.include('wrong-secret');
    });

    it('no password where one is required: TALLY_REDIS_AUTH (NOAUTH)', async () => {
      const redis = await server({ password: 'right-secret' });
      const space = testSpace('auth', { TALLY_REDIS_URL: redisUrl(redis) });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_AUTH', 'TALLY_REDIS_URL', 'NOAUTH');
    });

    it('an ACL user without +@scripting: TALLY_REDIS_NOPERM naming +@scripting', async () => {
      const redis = await server({});
      await asAdmin(redis, (admin) => admin.call('ACL', 'SETUSER', 'noscript', 'on', '>pw', '~*', '+@all', '-@scripting'));
      const space = testSpace('acl', { TALLY_REDIS_URL: redisUrl(redis, 'noscript:pw@') });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_NOPERM', 'NOPERM', '+@scripting', 'SCRIPT LOAD');
    });

    it('an ACL user without TIME (the layout check reads it for mode leases): TALLY_REDIS_NOPERM before anything runs', async () => {
      const redis = await server({});
      await asAdmin(redis, (admin) => admin.call('ACL', 'SETUSER', 'notime', 'on', '>pw', '~*', '+@all', '-time'));
      const space = testSpace('acl', { TALLY_REDIS_URL: redisUrl(redis, 'notime:pw@') });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_NOPERM', 'ACL SETUSER', '+time');
    });

    it('an ACL user whose key patterns miss the prefix: TALLY_REDIS_NOPERM naming the keys', async () => {
      const redis = await server({});
      await asAdmin(redis, (admin) => admin.call('ACL', 'SETUSER', 'narrow', 'on', '>pw', '~other:*', '+@all'));
      const space = testSpace('acl', { TALLY_REDIS_URL: redisUrl(redis, 'narrow:pw@') });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_NOPERM', 'NOPERM', '~<TALLY_PREFIX>*');
    });

    it('an ACL user that may read the prefix but not write it (%R~): refused before anything is written', async () => {
      const redis = await server({});
      await asAdmin(redis, (admin) => admin.call('ACL', 'SETUSER', 'reader', 'on', '>pw', '%R~*', '+@all'));
      const space = testSpace('acl', { TALLY_REDIS_URL: redisUrl(redis, 'reader:pw@') });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_NOPERM', 'NOPERM', 'EVALSHA');
    });

    it('the ACL the docs recommend is enough: an exact count through a user limited to the prefix', async () => {
      const redis = await server({});
      const space = testSpace('acl-ok');
      await asAdmin(redis, (admin) =>
        admin.call('ACL', 'SETUSER', 'tally', 'on', '>pw', `~${space.prefix}*`, '+@read', '+@write', '+@scripting', '+@connection', '+info', '+time'),
      );
      const env = { ...space.env, TALLY_REDIS_URL: redisUrl(redis, 'tally:pw@') };
      try {
        const daemon = await startDaemon(env);
        daemons.push(daemon);
        const workload = generateWorkload({ messages: 30, skus: 8, seed: 3, duplicateRate: 0.1, idPrefix: space.queue });
        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
        await waitForReadyEmpty(space.queue);
        await new Promise((resolve) => setTimeout(resolve, 500));
        expect((await stopDaemon(daemon)).code).to.equal(0);
        expect(daemon.logs.some((l) => l.includes('NOPERM'))).to.equal(false);
        const counts = await asAdmin(
          redis,
          async (admin) => new Map([...(await readCounts(admin, { prefix: space.prefix, virtualShards: 16 }, []))].map(([sku, v]) => [sku, Number(v)])),
        );
        expect(compare(counts, workload.truth).exact).to.equal(true);
        expect(await asAdmin(redis, (admin) => admin.hget(`${space.prefix}stats`, 'counted'))).to.equal('30');
      } finally {
        await cleanup(space);
      }
    });

    it('scripting renamed away: TALLY_REDIS_SCRIPTING', async () => {
      const redis = await server({ args: ['--rename-command', 'EVALSHA', ''] });
      const space = testSpace('script', { TALLY_REDIS_URL: redisUrl(redis) });
      const result = await runRefusedStart(space.env);
      expectOneLineRefusal(result, 'TALLY_REDIS_SCRIPTING', 'EVALSHA');
    });

    it('a Redis Cluster node that serves no slot yet: not refused, waited out as an outage naming cluster_state', async () => {
      // A cluster is detected and used (cluster.test.ts); one that is not ok is waited for, like any outage.
      const redis = await server({ args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf'] });
      const space = testSpace('cluster', { TALLY_REDIS_URL: redisUrl(redis) });
      const daemon = spawnDaemon(space.env);
      daemons.push(daemon);
      const line = await daemon.waitForLog('redis unavailable; retrying', 30_000);
      expect(line).to.match(/cluster_state|no master serving slots|slots cache/);
      expect(daemon.child.exitCode).to.equal(null);
    });

    it('an outage is still waited out: the daemon retries while Redis is down and starts once it is up', async () => {
      // The counterpart of the refusals above: a refused connection is not a configuration error.
      const port = await freePort();
      const space = testSpace('outage', { TALLY_REDIS_URL: `redis://127.0.0.1:${port}` });
      const daemon = spawnDaemon(space.env);
      const dir = await mkdtemp(join(tmpdir(), 'tally-test-redis-'));
      let late: ChildProcess | null = null;
      try {
        await daemon.waitForLog('redis unavailable; retrying');
        expect(daemon.child.exitCode).to.equal(null);
        // Bring a Redis up on that port: the same daemon goes on to consume.
        late = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
        await daemon.waitForLog('"msg":"consuming"', 30_000);
        expect((await stopDaemon(daemon)).code).to.equal(0);
      } finally {
        await stopDaemon(daemon);
        late?.kill('SIGKILL');
        await rm(dir, { recursive: true, force: true });
        await cleanup(space);
      }
    });
  });
});
