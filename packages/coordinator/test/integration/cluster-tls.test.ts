/**
 * A TLS Redis Cluster (3 masters + 3 replicas of our own, certificates made
 * by openssl): every node listens for TLS only (`--port 0 --tls-port`), and
 * the cluster bus and replication speak TLS (`--tls-cluster yes`,
 * `--tls-replication yes`). So a daemon that counts proves TLS to every node
 * the cluster announced, not only to the seeds, and a WAIT 1 that is met
 * proves the replicas got the writes over TLS.
 *
 * On the same cluster, the failure an operator met with TALLY_REDIS_WAIT_
 * REPLICAS=1: a master SIGKILLed and not brought back leaves its promoted
 * replica without a replica, and that master and the virtual shards it
 * holds must be named (/readyz, the gauge, one log line) until the old
 * master rejoins; then everything drains exactly.
 *
 * One cluster for the file (a start costs seconds); small workloads.
 */
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { makeTestCertificates, startRedisCluster, type RedisCluster, type TestCertificates } from '@tally/testkit';
import { keySlot } from '@tally/runtime';
import { describeShards } from '@tally/shared';
import { cleanup, compare, runRefusedStart, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { tallyCli } from './fleet-helpers.js';
import { brokerQueue, metricsText, readyz, sample, waitFor } from './runtime-probes.js';

const VIRTUAL_SHARDS = 16;

/** The virtual shards whose hash slot lies in one of `ranges` (`0-5460`, `5461`). */
function shardsIn(ranges: readonly string[]): number[] {
  const bounds = ranges.map((range) => range.split('-').map(Number) as [number, number?]);
  const inRanges = (slot: number): boolean => bounds.some(([low, high]) => slot >= low && slot <= (high ?? low));
  return Array.from({ length: VIRTUAL_SHARDS }, (_, shard) => shard).filter((shard) => inRanges(keySlot(`{${shard}}`)));
}

describe('TLS Redis Cluster (integration: 3 masters + 3 replicas, TLS only, bus and replication over TLS)', function () {
  this.timeout(240_000);
  let certs: TestCertificates;
  let cluster: RedisCluster;
  /** Two of the six nodes as seeds, in capitals: the client finds the rest from them and must speak TLS to each. */
  let seeds: string;

  before(async () => {
    const startedAt = Date.now();
    certs = await makeTestCertificates();
    cluster = await startRedisCluster({ tls: certs.redis });
    seeds = [cluster.seedUrls[0]!, cluster.seedUrls[4]!].map((url) => url.replace(/^rediss:/, 'REDISS:')).join(',');
    console.log(`      TLS cluster up in ${Date.now() - startedAt} ms`);
  });

  after(async () => {
    await cluster?.stop();
    await certs?.remove();
  });

  it('a certificate from another CA stops the start: exit 1, one stderr line naming the certificate problem and NODE_EXTRA_CA_CERTS', async () => {
    const startedAt = Date.now();
    const space = testSpace('ctls-wrong', { TALLY_REDIS_URL: seeds, NODE_EXTRA_CA_CERTS: certs.wrongCaFile });
    const refused = await runRefusedStart(space.env);
    expect(refused.code, refused.stderrLines.join('|')).to.equal(1);
    expect(refused.stderrLines).to.have.length(1);
    expect(refused.stderrLines[0]).to.include('not trusted').and.include('NODE_EXTRA_CA_CERTS');
    expect(refused.fatalCode).to.equal('TALLY_REDIS_TLS');
    expect(refused.logs.some((line) => line.includes('redis unavailable; retrying'))).to.equal(false);
    console.log(`      ${Date.now() - startedAt} ms`);
  });

  it('rediss:// seeds with the right CA count exactly with WAIT 1; a master lost for good is named by its promoted replica, and clears when the old one rejoins', async () => {
    const startedAt = Date.now();
    const space = testSpace('ctls', {
      TALLY_REDIS_URL: seeds,
      NODE_EXTRA_CA_CERTS: certs.caFile,
      TALLY_VIRTUAL_SHARDS: String(VIRTUAL_SHARDS),
      TALLY_REDIS_WAIT_REPLICAS: '1',
      TALLY_REDIS_WAIT_TIMEOUT_MS: '200',
      TALLY_BATCH_WAIT_MS: '10',
      TALLY_METRICS_PORT: '0',
    });
    try {
      const first = generateWorkload({ messages: 200, skus: 60, seed: 31, duplicateRate: 0.05, idPrefix: `${space.queue}-a` });
      const second = generateWorkload({ messages: 200, skus: 60, seed: 32, duplicateRate: 0.05, idPrefix: `${space.queue}-b` });
      const daemon = await startDaemon(space.env);
      expect(daemon.logs.some((line) => line.includes('redis cluster detected') && line.includes('"masters":3'))).to.equal(true);
      const port = Number(JSON.parse(await daemon.waitForLog('http endpoint listening')).port);

      // Over TLS to every master, and the WAIT met: the replicas have the writes, over TLS replication.
      await publishAll(first.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      await waitFor('the first part acked', async () => (await brokerQueue(space.queue)).unacked === 0, 30_000);
      expect((await readyz(port)).code).to.equal(200);
      const masters = await cluster.masters();
      for (const master of masters) {
        const labels = { server_address: '127.0.0.1', server_port: String(master.port) };
        const text = await metricsText(port);
        expect(
          sample(text, 'tally_redis_replicas_short', labels),
          `gauge 0 for ${master.port}: ${text
            .split('\n')
            .filter((l) => l.includes('replicas_short'))
            .join(' / ')}`,
        ).to.equal(0);
      }
      const firstCounts = await tallyCli(space.env, 'counts', '--json');
      expect(firstCounts.code, firstCounts.stderr).to.equal(0);
      const firstDiff = compare(new Map(Object.entries(JSON.parse(firstCounts.stdout) as Record<string, number>)), first.truth);
      expect(firstDiff.exact, `lost ${firstDiff.missingUnits}, excess ${firstDiff.excessUnits}`).to.equal(true);
      const countedAt = Date.now();

      // A master SIGKILLed and not brought back: its replica takes over, with no replica of its own.
      const { killed, promoted } = await cluster.failover();
      const promotedAddress = `127.0.0.1:${promoted.port}`;
      const heldShards = shardsIn(promoted.slots);
      expect(heldShards.length, 'the lost master held some of the 16 shards').to.be.greaterThan(0);
      await publishAll(second.publishes, { url: AMQP_URL, queue: space.queue });
      const notReady = await waitFor(
        '/readyz to name the promoted master',
        async () => {
          const answer = await readyz(port);
          return answer.code === 503 && answer.body.reason?.includes(`master ${promotedAddress} has 0 online replicas`) ? answer : null;
        },
        30_000,
        100,
      );
      expect(notReady.body.reason).to.include(`(virtual shards ${describeShards(heldShards)}:`);
      expect(sample(await metricsText(port), 'tally_redis_replicas_short', { server_port: String(promoted.port) })).to.equal(1);
      const held = await brokerQueue(space.queue);
      expect(held.unacked, 'deliveries with a part on the short master stay unacked').to.be.greaterThan(0);
      const namedAfterMs = Date.now() - countedAt;

      // The old master comes back: it rejoins as the promoted one's replica, and everything drains.
      await cluster.restartNode(killed.port);
      await cluster.waitForHealthy();
      await waitFor('/readyz ready again', async () => (await readyz(port)).code === 200, 60_000, 200);
      await waitFor('everything acked', async () => (await brokerQueue(space.queue)).ready + (await brokerQueue(space.queue)).unacked === 0, 60_000);
      expect(sample(await metricsText(port), 'tally_redis_replicas_short', { server_port: String(promoted.port) })).to.equal(0);
      const startLines = daemon.logs.filter((line) => line.includes('"msg":"redis WAIT for 1 replica cannot be met'));
      expect(startLines.map((line) => (JSON.parse(line) as { master: string }).master)).to.deep.equal([promotedAddress]);
      expect(daemon.logs.filter((line) => line.includes(`redis master ${promotedAddress} has 1 online replica(s) again`))).to.have.length(1);
      expect((await stopDaemon(daemon)).code).to.equal(0);

      const truth = new Map(first.truth);
      for (const [sku, n] of second.truth) truth.set(sku, (truth.get(sku) ?? 0) + n);
      const countsOut = await tallyCli(space.env, 'counts', '--json');
      expect(countsOut.code, countsOut.stderr).to.equal(0);
      const diff = compare(new Map(Object.entries(JSON.parse(countsOut.stdout) as Record<string, number>)), truth);
      expect(diff.exact, `lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
      console.log(
        `      shards ${describeShards(heldShards)} on ${promotedAddress} named ${namedAfterMs} ms after the first part was counted (failover included); ` +
          `${held.unacked} held; ${Date.now() - startedAt} ms`,
      );
    } finally {
      await cleanup(space);
    }
  });
});
