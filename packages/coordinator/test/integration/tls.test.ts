/**
 * TLS to Redis for real: a CA and a server certificate made
 * with openssl here, a redis-server listening on its TLS port only (no
 * plaintext port at all, so any success proves TLS was spoken), and a URL
 * whose scheme is written in capitals, which used to connect in plaintext
 * and send the password in the clear.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { generateWorkload, publishAll } from '@tally/workload';
import { readCounts } from '../../src/commands/counts.js';
import { cleanup, compare, runRefusedStart, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { tallyCli } from './fleet-helpers.js';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';

const run = promisify(execFile);

interface Certificates {
  readonly dir: string;
  readonly caFile: string;
  readonly wrongCaFile: string;
  readonly certFile: string;
  readonly keyFile: string;
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  await run('openssl', args, { cwd: dir, timeout: 60_000 });
}

/** A CA, a server certificate it signs for 127.0.0.1 and localhost, and an unrelated second CA. */
async function makeCertificates(): Promise<Certificates> {
  const dir = await mkdtemp(join(tmpdir(), 'tally-test-tls-'));
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  await openssl(dir, 'req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=Tally test CA');
  await openssl(dir, 'req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  await writeFile(
    join(dir, 'server.ext'),
    'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n',
  );
  await openssl(
    dir,
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.pem',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'server.pem',
    '-days',
    '2',
    '-extfile',
    'server.ext',
  );
  await openssl(dir, 'req', '-x509', ...ec, '-keyout', 'wrong-ca.key', '-out', 'wrong-ca.pem', '-days', '2', '-subj', '/CN=Some other CA');
  return { dir, caFile: join(dir, 'ca.pem'), wrongCaFile: join(dir, 'wrong-ca.pem'), certFile: join(dir, 'server.pem'), keyFile: join(dir, 'server.key') };
}

describe('TLS to Redis (integration: redis-server on its TLS port, certificates made by openssl)', function () {
  this.timeout(180_000);
  const PASSWORD = 'tls-secret-pw';
  let certs: Certificates;
  let redis: PrivateRedis;

  before(async () => {
    certs = await makeCertificates();
    redis = await startPrivateRedis({
      password: PASSWORD,
      args: ['--appendonly', 'yes'],
      tls: { certFile: certs.certFile, keyFile: certs.keyFile, caFile: certs.caFile, ca: await readFile(certs.caFile) },
    });
  });
  after(async () => {
    await redis?.stop();
    if (certs) await rm(certs.dir, { recursive: true, force: true });
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
        expect(workload.truth.size).to.be.greaterThan(5);
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
      const refused = await runRefusedStart(space.env);
      expect(refused.code, refused.stderrLines.join('|')).to.equal(1);
      expect(refused.stderrLines).to.have.length(1);
      expect(refused.stderrLines[0]).to.include('does not speak TLS').and.include('tls-port');
    } finally {
      await plain.stop();
    }
  });
});
