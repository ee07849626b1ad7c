/**
 * TLS to the broker, against a RabbitMQ node of the test's own with only a
 * TLS listener (testkit rabbit-cluster.ts, certificates from openssl): the
 * daemon and the CLI count exactly over `amqps://` (and `AMQPS://`) with the
 * test CA in NODE_EXTRA_CA_CERTS, and a certificate they do not trust stops
 * the start with exit 1 and one line naming the problem and the fix, as a
 * `rediss://` with the wrong CA does.
 */
import { readFileSync } from 'node:fs';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { deleteKeys, makeTestCertificates, startRabbitCluster, type RabbitCluster, type TestCertificates } from '@tally/testkit';
import { compare, countsOf, runRefusedStart, statsOf, testSpace, REDIS_URL } from './harness.js';
import { drainAt, type SocketOptions } from './private-broker.js';
import { tallyCli } from './fleet-helpers.js';

describe('TLS to RabbitMQ (a node with only a TLS listener)', function () {
  this.timeout(180_000);
  let certs: TestCertificates;
  let broker: RabbitCluster;
  let socket: SocketOptions;

  before(async () => {
    const started = Date.now();
    certs = await makeTestCertificates();
    broker = await startRabbitCluster({ nodes: 1, tls: certs });
    socket = { ca: [readFileSync(certs.caFile)] };
    console.log(`      TLS node up in ${Date.now() - started} ms`);
  });

  after(async () => {
    await broker?.stop();
    await certs?.remove();
  });

  it('amqps:// and AMQPS:// with the CA in NODE_EXTRA_CA_CERTS count exactly; tally status reads the queue over TLS', async () => {
    const url = broker.urls[0]!;
    const space = testSpace('amqps', { TALLY_AMQP_URL: url, NODE_EXTRA_CA_CERTS: certs.caFile, TALLY_HEARTBEAT_MS: '250' });
    try {
      const workload = generateWorkload({ messages: 3_000, skus: 300, seed: 71, duplicateRate: 0.02, idPrefix: space.queue });
      const half = Math.floor(workload.publishes.length / 2);
      await publishAll(workload.publishes.slice(0, half), { url, queue: space.queue, socket });
      const first = await drainAt(space.env, url, space.queue, socket);
      // The scheme in capitals: lowered at start, so amqplib still takes the TLS path (it tests 'amqps:').
      const upper = { ...space.env, TALLY_AMQP_URL: url.replace(/^amqps:/, 'AMQPS:') };
      await publishAll(workload.publishes.slice(half), { url, queue: space.queue, socket });
      const second = await drainAt(upper, url, space.queue, socket);
      expect([...first, ...second].map((exit) => exit.code)).to.deep.equal([...first, ...second].map(() => 0));

      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.below, 'lost').to.deep.equal([]);
      expect(diff.excess.size, 'counted twice').to.equal(0);
      const stats = await statsOf(space.prefix);
      expect(stats.received).to.be.at.least(workload.publishes.length);

      // The CLI over the same TLS listener: the queue's depth comes from the broker, not an "unreachable" line.
      const status = await tallyCli(upper, 'status', '--json');
      expect(status.code, status.stderr).to.equal(0);
      const report = JSON.parse(status.stdout) as { queue: { exists: boolean | null; depth: number | null; error?: string } };
      expect(report.queue.error, 'tally status reached the TLS listener').to.equal(undefined);
      expect(report.queue).to.deep.include({ exists: true, depth: 0 });
    } finally {
      await deleteKeys(REDIS_URL, space.prefix);
    }
  });

  it('a certificate the daemon does not trust stops the start: exit 1, TALLY_AMQP_TLS, one stderr line naming the problem and NODE_EXTRA_CA_CERTS', async () => {
    const url = broker.urls[0]!.replace('guest:guest', 'guest:guest-s3cret');
    const trusts: Array<Record<string, string>> = [{}, { NODE_EXTRA_CA_CERTS: certs.wrongCaFile }];
    for (const trust of trusts) {
      const space = testSpace('amqps-untrusted', { TALLY_AMQP_URL: url, ...trust });
      const started = Date.now();
      const refused = await runRefusedStart(space.env, 30_000);
      const tookMs = Date.now() - started;
      expect(refused.code, `exit code (stderr: ${refused.stderr})`).to.equal(1);
      expect(refused.fatalCode).to.equal('TALLY_AMQP_TLS');
      expect(refused.stderrLines).to.have.length(1);
      expect(refused.stderr)
        .to.include('NODE_EXTRA_CA_CERTS')
        .and.match(/certificate/i)
        .and.match(/SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_VERIFY_LEAF_SIGNATURE/);
      expect(refused.stderr + refused.logs.join('\n')).not.to.include('s3cret');
      // Refused at the first attempt, not after a retry loop.
      expect(refused.logs.some((l) => l.includes('amqp connect failed; retrying'))).to.equal(false);
      expect(tookMs, 'refused at once').to.be.below(15_000);
      await deleteKeys(REDIS_URL, space.prefix);
    }
  });

  it('the CLI refuses the untrusted certificate with the same fix, exit 1', async () => {
    const space = testSpace('amqps-cli', { TALLY_AMQP_URL: broker.urls[0]!, NODE_EXTRA_CA_CERTS: certs.wrongCaFile });
    const listing = await tallyCli(space.env, 'dead', 'list', '--json');
    expect(listing.code).to.equal(1);
    expect(listing.stderr.trim().split('\n')).to.have.length(1);
    expect(listing.stderr)
      .to.include('NODE_EXTRA_CA_CERTS')
      .and.match(/not trusted/);
  });
});
