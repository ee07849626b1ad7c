/**
 * TLS to Redis for real: a CA and a server certificate made
 * with openssl here, a redis-server listening on its TLS port only (no
 * plaintext port at all, so any success proves TLS was spoken), and a URL
 * whose scheme is written in capitals, which used to connect in plaintext
 * and send the password in the clear.
 */
import { readFile } from 'node:fs/promises';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { generateWorkload, publishAll } from '@tally/workload';
import { readCounts } from '../../src/commands/counts.js';
import { readStats } from '../../src/commands/stats.js';
import { cleanup, compare, runRefusedStart, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { tallyCli } from './fleet-helpers.js';
import { makeTestCertificates, startPrivateRedis, type PrivateRedis, type TestCertificates } from '@tally/testkit';

describe('TLS to Redis (integration: redis-server on its TLS port, certificates made by openssl)', function () {
  this.timeout(180_000);
  const PASSWORD = 'tls-secret-pw';
  let certs: TestCertificates;
  let redis: PrivateRedis;

  before(async () => {
    certs = await makeTestCertificates();
    redis = await startPrivateRedis({ password: PASSWORD, args: ['--appendonly', 'yes'], tls: certs.redis });
  });
  after(async () => {
    await redis?.stop();
    await certs?.remove();
  });

  it('REDISS:// (capitals) with NODE_EXTRA_CA_CERTS: the daemon and its threads speak TLS and count exactly', async () => {
    const url = `REDISS://:${PASSWORD}@127.0.0.1:${redis.port}`;
    const space = testSpace('tls', { TALLY_REDIS_URL: url, NODE_EXTRA_CA_CERTS: certs.caFile, TALLY_WORKERS: '2' });
    try {
      const daemon = await startDaemon(space.env);
      const starting = JSON.parse(daemon.logs.find((l) => l.includes('"msg":"starting"'))!) as { redis: string };
      expect(starting.redis).to.equal(`rediss://:***@127.0.0.1:${redis.port}`);
      const workload = generateWorkload({ messages: 40, skus: 12, minChanges: 1, maxChanges: 4, duplicateRate: 0.1, seed: 9, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect((await stopDaemon(daemon)).code).to.equal(0);
      expect(daemon.logs.join('\n')).not.to.include(PASSWORD);

      // Read back over TLS too: the server has no plaintext port.
      const reader = new Redis(`rediss://:${PASSWORD}@127.0.0.1:${redis.port}`, { tls: { ca: await readFile(certs.caFile) }, lazyConnect: true });
      try {
        await reader.connect();
        const counts = new Map([...(await readCounts(reader, { prefix: space.prefix, virtualShards: 16 }, []))].map(([sku, value]) => [sku, Number(value)]));
        const diff = compare(counts, workload.truth);
        expect(diff.exact, `below ${diff.below.join(',')}, above ${[...diff.excess.keys()].join(',')}`).to.equal(true);
        expect(counts.size).to.equal(workload.truth.size);
        // The daemon's own counters, written over TLS: every publish received, each message counted once, every copy recognised.
        const stats = await readStats(reader, { prefix: space.prefix });
        expect(stats.received, 'received').to.equal(workload.publishes.length);
        expect(stats.counted + stats.empty, 'counted once').to.equal(workload.good);
        expect(stats.duplicates, 'copies recognised').to.equal(workload.duplicates);
      } finally {
        reader.disconnect();
      }

      // The CLI takes the same capitalised URL and speaks TLS as well.
      const cli = await tallyCli({ ...space.env }, 'counts', '--json');
      expect(cli.code, cli.stderr).to.equal(0);
      expect(JSON.parse(cli.stdout)).to.deep.equal(Object.fromEntries(workload.truth));
    } finally {
      await cleanup(space);
    }
  });

  it('a certificate from another CA is refused: exit 1, one line naming NODE_EXTRA_CA_CERTS, no retry loop', async () => {
    const space = testSpace('tls', { TALLY_REDIS_URL: `Rediss://:${PASSWORD}@127.0.0.1:${redis.port}`, NODE_EXTRA_CA_CERTS: certs.wrongCaFile });
    const refused = await runRefusedStart(space.env);
    expect(refused.code, refused.stderrLines.join('|')).to.equal(1);
    expect(refused.stderrLines).to.have.length(1);
    expect(refused.stderrLines[0]).to.include('NODE_EXTRA_CA_CERTS').and.include('not trusted');
    expect(refused.stderrLines[0]).not.to.include(PASSWORD);
    expect(refused.fatalCode).to.equal('TALLY_REDIS_TLS');
    expect(refused.logs.some((l) => l.includes('redis unavailable; retrying'))).to.equal(false);

    // The CLI says the same in one line.
    const cli = await tallyCli(space.env, 'counts', '--json');
    expect(cli.code).to.equal(1);
    expect(cli.stderr.trim().split('\n')).to.have.length(1);
    expect(cli.stderr).to.include('NODE_EXTRA_CA_CERTS');
  });

  it('without NODE_EXTRA_CA_CERTS the private CA is not trusted either: verification stays on', async () => {
    const space = testSpace('tls', { TALLY_REDIS_URL: `rediss://:${PASSWORD}@127.0.0.1:${redis.port}` });
    const refused = await runRefusedStart(space.env);
    expect(refused.code).to.equal(1);
    expect(refused.stderr).to.include('NODE_EXTRA_CA_CERTS');
  });

  it('rediss:// to a plaintext port is refused naming the TLS port, not retried', async () => {
    const plain = await startPrivateRedis({});
    try {
      const space = testSpace('tls', { TALLY_REDIS_URL: `rediss://127.0.0.1:${plain.port}` });
      const started = performance.now();
      const refused = await runRefusedStart(space.env);
      // A plaintext port never answers the handshake: the PING beside it names the problem, not the 10 s connect timeout.
      expect(performance.now() - started, 'refused before the connect timeout').to.be.below(8_000);
      expect(refused.code, refused.stderrLines.join('|')).to.equal(1);
      expect(refused.stderrLines).to.have.length(1);
      expect(refused.stderrLines[0]).to.include('does not speak TLS').and.include('tls-port');
    } finally {
      await plain.stop();
    }
  });
});
