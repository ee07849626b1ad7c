/**
 * Redis behind Sentinel, against real processes: one primary, one replica
 * and three Sentinels on loopback (testkit redis-sentinel.ts), the daemon
 * given only TALLY_REDIS_URL=redis+sentinel://…/master. Mid-stream the
 * primary is SIGKILLed and never brought back; the Sentinels promote the
 * replica and the daemon must follow it without a restart.
 *
 * With TALLY_REDIS_WAIT_REPLICAS=1 no ack precedes the replica's copy, so
 * the failover loses nothing: atomic counts exactly, two-step loses nothing
 * and overcounts at most what `tally deviation` bounds for one crash. The
 * promoted primary has no replica of its own, so its WAIT cannot be met
 * until the test gives it one (a fresh, empty server: the operator's
 * replacement for the lost node), which is also what the daemon names
 * meanwhile.
 *
 * What the operator sees is checked too: the switch and the failover in
 * progress in the log, /readyz naming the primary before and after,
 * tally_redis_failovers_total, and `tally status` (through the Sentinels).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { escapeGlob, type DeviationEstimate } from '@tally/shared';
import { asAdmin, makeTestCertificates, startSentinelGroup, type SentinelGroup, type TestCertificates } from '@tally/testkit';
import { generateWorkload, publishAll } from '@tally/workload';
import type { StatusReport } from '../../src/commands/status.js';
import { tallyCli } from './fleet-helpers.js';
import {
  cleanup,
  compare,
  publishPaced,
  runRefusedStart,
  startDaemon,
  stopDaemon,
  testSpace,
  waitForReadyEmpty,
  AMQP_URL,
  type DaemonProcess,
  type RefusedStart,
} from './harness.js';
import { brokerQueue, countsAt, metricsText, readyz, sample, waitFor } from './runtime-probes.js';

interface PrimaryView {
  readonly primary: string | null;
  readonly failoverInProgress: boolean;
  readonly failovers: number;
}

/** Batch receipts written on one node: the daemon is at work there. */
async function receiptsOn(port: number, prefix: string): Promise<number> {
  const redis = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => null });
  redis.on('error', () => {});
  try {
    let cursor = '0';
    let total = 0;
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${escapeGlob(prefix)}w:{*}:*`, 'COUNT', 10_000);
      cursor = next;
      total += keys.length;
    } while (cursor !== '0');
    return total;
  } finally {
    redis.disconnect();
  }
}

describe('Redis Sentinel (integration: 1 primary, 1 replica, 3 Sentinels; the primary SIGKILLed mid-stream)', function () {
  this.timeout(150_000);

  for (const mode of ['atomic', 'two-step'] as const) {
    it(`${mode}, WAIT 1: the daemon follows the promoted primary without a restart, ${mode === 'atomic' ? 'counts exact' : 'nothing lost'}, the failover shows`, async () => {
      const started = Date.now();
      let group: SentinelGroup | null = null;
      const maxChanges = 4;
      const maxDelta = 9;
      let daemon: DaemonProcess | null = null;
      const space = testSpace(`sentinel-${mode}`, {
        TALLY_MODE: mode,
        TALLY_REDIS_WAIT_REPLICAS: '1',
        TALLY_REDIS_WAIT_TIMEOUT_MS: '300',
        TALLY_BATCH_SIZE: '100',
        TALLY_METRICS_PORT: '0',
      });
      try {
        group = await startSentinelGroup({ masterName: `tally-${mode}` });
        const env = { ...space.env, TALLY_REDIS_URL: group.url };
        const old = group.nodes[0]!;
        const workload = generateWorkload({ messages: 6_000, skus: 800, seed: 26, duplicateRate: 0.02, idPrefix: space.queue, maxChanges, maxDelta });

        daemon = await startDaemon(env);
        const port = Number(JSON.parse(await daemon.waitForLog('http endpoint listening')).port);
        const before = await readyz(port);
        expect(before.code, 'ready behind the Sentinels').to.equal(200);
        expect(before.body.redisPrimary, '/readyz names the primary').to.include({ primary: `127.0.0.1:${old.port}`, failovers: 0, failoverInProgress: false });
        const statusBefore = JSON.parse((await tallyCli(env, 'status', '--json')).stdout) as StatusReport;
        expect(statusBefore.sentinel, 'tally status names the primary').to.include({
          master: `tally-${mode}`,
          primary: `127.0.0.1:${old.port}`,
          failover_in_progress: false,
        });

        // A stream, not a preload: messages keep arriving through the failover.
        const publishing = publishPaced(workload.publishes, space.queue, 100, 40);
        await waitFor('batches written on the first primary', async () => (await receiptsOn(old.port, space.prefix)) >= 5, 30_000, 20);
        process.kill(old.pid, 'SIGKILL');
        const killedAt = Date.now();

        // What /readyz says meanwhile, polled until the daemon follows the new primary.
        const seen: string[] = [];
        const watching = (async () => {
          for (;;) {
            const answer = await readyz(port).catch(() => null);
            const view = answer?.body.redisPrimary as PrimaryView | undefined;
            if (answer !== null && answer.code !== 200 && answer.body.reason !== null) seen.push(answer.body.reason);
            if (view !== undefined && view.failovers > 0 && !view.failoverInProgress) return;
            if (Date.now() - killedAt > 60_000) return;
            await sleep(100);
          }
        })();
        const promoted = await group.waitForNewPrimary(old.port);
        const switchedAfterMs = Date.now() - killedAt;
        // The promoted primary has no replica: WAIT 1 holds every ack until it gets one.
        await group.addReplica();
        await watching;
        await publishing;
        try {
          await waitForReadyEmpty(space.queue);
          await waitFor('every delivery acked', async () => (await brokerQueue(space.queue)).unacked === 0, 60_000);
        } catch (error) {
          // A stall must say where it is: what /readyz, the broker and the daemon's last warnings said.
          const ready = await readyz(port).catch((e: unknown) => ({ code: 0, body: { reason: String(e) } }));
          const warnings = daemon.logs.filter((line) => !line.startsWith('{"level":30')).slice(-12);
          throw new Error(
            `${(error as Error).message}; /readyz ${ready.code}: ${JSON.stringify(ready.body.reason)}; ` +
              `broker: ${JSON.stringify(await brokerQueue(space.queue))}; the daemon's last warnings:\n${warnings.join('\n')}`,
          );
        }
        const drainedAfterMs = Date.now() - killedAt;

        // The replica watch sees the new replica at its next check (every 5 s).
        const after = await waitFor(
          '/readyz ready on the new primary',
          async () => {
            const answer = await readyz(port);
            return answer.code === 200 ? answer : null;
          },
          15_000,
        );
        expect(after.body.redisPrimary, '/readyz names the new primary').to.include({ primary: `127.0.0.1:${promoted}`, failoverInProgress: false });
        expect((after.body.redisPrimary as PrimaryView).failovers).to.equal(1);
        expect(
          sample(await metricsText(port), 'tally_redis_failovers_total', { tally_redis_sentinel_master: `tally-${mode}` }),
          'the failover counted',
        ).to.equal(1);
        expect(
          daemon.logs.some((line) => line.includes(`switched from 127.0.0.1:${old.port} to 127.0.0.1:${promoted}`)),
          'the switch logged',
        ).to.equal(true);
        expect(
          daemon.logs.some((line) => line.includes('redis failover in progress')),
          'the failover in progress logged',
        ).to.equal(true);
        expect(
          seen.some((reason) => reason.includes('failover in progress') || reason.includes('redis connection down') || reason.includes('cannot be met')),
          `/readyz said why it was not ready (${JSON.stringify([...new Set(seen)])})`,
        ).to.equal(true);
        const statusAfter = JSON.parse((await tallyCli(env, 'status', '--json')).stdout) as StatusReport;
        expect(statusAfter.sentinel, 'tally status follows').to.include({ primary: `127.0.0.1:${promoted}` });

        const deviation = JSON.parse(
          (await tallyCli(env, 'deviation', '--crashes-per-month', '1', '--recovery', 'p100=10s', '--json')).stdout,
        ) as DeviationEstimate;
        const stopped = await stopDaemon(daemon);
        daemon = null;
        expect(stopped.code, 'the daemon stops cleanly, never restarted').to.equal(0);

        const check = compare(await countsAt(`redis://127.0.0.1:${promoted}`, space.prefix), workload.truth);
        const boundUnits = deviation.boundPerMonth * maxChanges * maxDelta;
        console.log(
          `      ${mode}: switch seen ${switchedAfterMs} ms after the kill, drained ${drainedAfterMs} ms after it; ` +
            `lost ${check.missingUnits} units, overcount ${check.excessUnits} (bound ${boundUnits}); /readyz said: ${JSON.stringify([...new Set(seen)])}; ` +
            `${Math.round((Date.now() - started) / 1000)} s in all`,
        );
        expect(check.below, 'nothing lost').to.deep.equal([]);
        if (mode === 'atomic') expect(check.exact, 'atomic: exact').to.equal(true);
        else expect(check.excessUnits, 'two-step: the overcount within the deviation bound of one crash').to.be.at.most(boundUnits);
      } finally {
        if (daemon !== null) await stopDaemon(daemon);
        await group?.stop();
        await cleanup(space);
      }
    });
  }
});

/**
 * The same guards as for any Redis, and the Sentinels' own: against a group
 * that speaks TLS only (data nodes, replication and Sentinels) with a
 * password on the data nodes and another on the Sentinels. A wrong master
 * name or Sentinel password stops the start with one line naming it, not a
 * retry loop on "All sentinels are unreachable".
 */
describe('Redis Sentinel start guards and TLS (integration: TLS only, data and Sentinel passwords)', function () {
  this.timeout(120_000);
  const DATA_PASSWORD = 'data-s3cret';
  const SENTINEL_PASSWORD = 'sentinel-s3cret';
  let certs: TestCertificates;
  let group: SentinelGroup;
  let hosts: string;

  before(async () => {
    certs = await makeTestCertificates();
    group = await startSentinelGroup({ masterName: 'tally-tls', tls: certs.redis, password: DATA_PASSWORD, sentinelPassword: SENTINEL_PASSWORD });
    hosts = group.sentinelPorts.map((port) => `127.0.0.1:${port}`).join(',');
  });
  after(async () => {
    await group?.stop();
    await certs?.remove();
  });

  const url = (userinfo: string, path: string, query: string): string => `rediss+sentinel://${userinfo}${hosts}/${path}${query}`;
  const refused = async (redisUrl: string): Promise<RefusedStart> => {
    const space = testSpace('sentinel-guard', { TALLY_REDIS_URL: redisUrl, NODE_EXTRA_CA_CERTS: certs.caFile });
    const result = await runRefusedStart(space.env);
    expect(result.code, `exit code; stderr: ${result.stderr}`).to.equal(1);
    expect(result.stderrLines, 'one stderr line').to.have.length(1);
    expect(
      result.logs.some((line) => line.includes('redis unavailable; retrying')),
      'not a retry loop',
    ).to.equal(false);
    expect(result.stderr + result.logs.join('\n'), 'no password in any line')
      .not.to.include(DATA_PASSWORD)
      .and.not.to.include(SENTINEL_PASSWORD);
    return result;
  };

  it('a master name no Sentinel monitors: exit 1, TALLY_REDIS_SENTINEL naming the name', async () => {
    const result = await refused(url(`:${DATA_PASSWORD}@`, 'no-such-master', `?sentinelPassword=${SENTINEL_PASSWORD}`));
    expect(result.fatalCode).to.equal('TALLY_REDIS_SENTINEL');
    expect(result.stderrLines[0]).to.include('"no-such-master"').and.include('sentinel monitor');
  });

  it("without the Sentinels' password: exit 1, TALLY_REDIS_AUTH naming sentinelPassword", async () => {
    const result = await refused(url(`:${DATA_PASSWORD}@`, 'tally-tls', ''));
    expect(result.fatalCode).to.equal('TALLY_REDIS_AUTH');
    expect(result.stderrLines[0]).to.include('sentinelPassword');
  });

  it('a wrong password for the data nodes: exit 1, TALLY_REDIS_AUTH', async () => {
    const result = await refused(url(':wrong@', 'tally-tls', `?sentinelPassword=${SENTINEL_PASSWORD}`));
    expect(result.fatalCode).to.equal('TALLY_REDIS_AUTH');
  });

  it('an evicting primary behind the Sentinels: exit 1, TALLY_REDIS_EVICTION_POLICY', async () => {
    const primary = group.nodes.find((node) => node.port === primaryPortNow)!;
    await asAdmin(primary, (admin) => admin.config('SET', 'maxmemory-policy', 'allkeys-lru'));
    try {
      const result = await refused(group.url);
      expect(result.fatalCode).to.equal('TALLY_REDIS_EVICTION_POLICY');
      expect(result.stderrLines[0]).to.include('allkeys-lru');
    } finally {
      await asAdmin(primary, (admin) => admin.config('SET', 'maxmemory-policy', 'noeviction'));
    }
  });

  it('TLS to the Sentinels and the data nodes, both passwords: the daemon, its threads and the CLI count exactly; no password logged', async () => {
    const space = testSpace('sentinel-tls', { TALLY_REDIS_URL: group.url, NODE_EXTRA_CA_CERTS: certs.caFile, TALLY_WORKERS: '2' });
    try {
      const daemon = await startDaemon(space.env);
      const starting = JSON.parse(daemon.logs.find((line) => line.includes('"msg":"starting"'))!) as { redis: string };
      expect(starting.redis).to.equal(`rediss+sentinel://:***@${hosts}/tally-tls?sentinelPassword=***`);
      const workload = generateWorkload({ messages: 300, skus: 40, maxChanges: 4, duplicateRate: 0.05, seed: 27, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      await waitFor('every delivery acked', async () => (await brokerQueue(space.queue)).unacked === 0, 30_000);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      expect(daemon.logs.join('\n')).not.to.include(DATA_PASSWORD).and.not.to.include(SENTINEL_PASSWORD);

      const cli = await tallyCli(space.env, 'counts', '--json');
      expect(cli.code, cli.stderr).to.equal(0);
      expect(JSON.parse(cli.stdout)).to.deep.equal(Object.fromEntries(workload.truth));
      const status = await tallyCli(space.env, 'status');
      expect(status.code, status.stderr).to.equal(0);
      expect(status.stdout).to.include(`redis   sentinel master tally-tls: primary 127.0.0.1:${primaryPortNow}, 1 replica, 3 Sentinels`);
    } finally {
      await cleanup(space);
    }
  });

  let primaryPortNow = 0;
  beforeEach(async () => {
    primaryPortNow = (await group.primaryPort()) ?? 0;
  });
});
