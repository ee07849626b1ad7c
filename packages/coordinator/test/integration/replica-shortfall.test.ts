/**
 * An unmeetable WAIT is named. A daemon with TALLY_REDIS_WAIT_REPLICAS=1
 * against a private master and replica; the replica is SIGKILLed while the
 * daemon runs and not brought back, so the master has 0 replicas and no
 * batch can be acked. What the operator must see, long before the stall's
 * 30 s: /readyz 503 naming the master (host:port) and its virtual shards,
 * tally_redis_replicas_short 1 for that master, one log line (not one per
 * WAIT retry). Nothing is acked meanwhile. A new replica of the master
 * clears it: the gauge is back to 0, one line says so, and everything drains
 * exactly.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import { cleanup, compare, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { brokerQueue, countsAt, metricsText, readyz, sample, waitFor } from './runtime-probes.js';
import { startReplicatedRedis, waitForLink } from './replicated-redis.js';

const START_LINE = '"msg":"redis WAIT for 1 replica cannot be met';
const CLEAR_LINE = 'online replica(s) again: WAIT for 1 can be met';

describe('an unmeetable WAIT is named (integration, private master and replica)', function () {
  this.timeout(120_000);

  it('replica SIGKILLed: /readyz 503 naming the master and shards, gauge 1, one log line, nothing acked; a new replica clears it exactly', async () => {
    const started = Date.now();
    const redis = await startReplicatedRedis();
    let newReplica: PrivateRedis | null = null;
    const space = testSpace('wait-short', {
      TALLY_REDIS_URL: redis.master.url,
      TALLY_REDIS_WAIT_REPLICAS: '1',
      TALLY_REDIS_WAIT_TIMEOUT_MS: '200',
      TALLY_BATCH_WAIT_MS: '10',
      TALLY_METRICS_PORT: '0',
    });
    const master = `127.0.0.1:${redis.master.port}`;
    const gauge = async (port: number): Promise<number | null> =>
      sample(await metricsText(port), 'tally_redis_replicas_short', { server_address: '127.0.0.1', server_port: String(redis.master.port) });
    try {
      const first = generateWorkload({ messages: 150, skus: 40, seed: 21, duplicateRate: 0.05, idPrefix: `${space.queue}-a` });
      const second = generateWorkload({ messages: 150, skus: 40, seed: 22, duplicateRate: 0.05, idPrefix: `${space.queue}-b` });
      const daemon = await startDaemon(space.env);
      const port = Number(JSON.parse(await daemon.waitForLog('http endpoint listening')).port);
      await publishAll(first.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      await waitFor('the first part acked', async () => (await brokerQueue(space.queue)).unacked === 0, 30_000);
      expect((await readyz(port)).code, 'ready while the replica is there').to.equal(200);
      expect(await gauge(port), 'gauge 0 while the WAIT can be met').to.equal(0);

      process.kill(redis.replica.pid, 'SIGKILL');
      const killedAt = Date.now();
      await publishAll(second.publishes, { url: AMQP_URL, queue: space.queue });
      const notReady = await waitFor(
        '/readyz to name the short master',
        async () => {
          const answer = await readyz(port);
          return answer.code === 503 && answer.body.reason?.includes('cannot be met') ? answer : null;
        },
        30_000,
        100,
      );
      const namedAfterMs = Date.now() - killedAt;
      expect(notReady.body.reason)
        .to.include(`master ${master} has 0 online replicas`)
        .and.include('virtual shards 0-15')
        .and.include('TALLY_REDIS_WAIT_REPLICAS');
      expect(notReady.body.reason, 'named before any stall is reported').not.to.include('stalled');
      expect(await gauge(port), 'gauge 1 for the master').to.equal(1);

      // Held, not acked, for several more checks and many WAIT retries: still one start line.
      await waitForReadyEmpty(space.queue);
      await sleep(6_000);
      const held = await brokerQueue(space.queue);
      expect(held.unacked, 'nothing acked that no replica has').to.equal(second.publishes.length);
      const startLines = daemon.logs.filter((line) => line.includes(START_LINE));
      expect(startLines, 'one start line, not one per retry').to.have.length(1);
      expect(JSON.parse(startLines[0]!)).to.include({ level: 40, master, replicas: 0, wanted: 1, shards: 16 });
      const waitRetries = daemon.logs.filter((line) => line.includes('replicas did not acknowledge')).length;
      expect(waitRetries, 'the batches kept retrying their WAIT meanwhile').to.be.greaterThan(5);
      expect(daemon.logs.some((line) => line.includes(CLEAR_LINE))).to.equal(false);

      // A replica comes back (a new server: the old one's data went with it).
      newReplica = await startPrivateRedis({ args: ['--replicaof', '127.0.0.1', String(redis.master.port)] });
      await waitForLink(newReplica.url);
      await waitFor('/readyz ready again', async () => (await readyz(port)).code === 200, 30_000, 100);
      await waitFor('everything acked', async () => (await brokerQueue(space.queue)).unacked === 0, 30_000);
      expect(await gauge(port), 'gauge back to 0').to.equal(0);
      const clearLines = daemon.logs.filter((line) => line.includes(CLEAR_LINE));
      expect(clearLines, 'one clear line').to.have.length(1);
      expect(JSON.parse(clearLines[0]!)).to.include({ master, replicas: 1 });
      expect(daemon.logs.filter((line) => line.includes(START_LINE))).to.have.length(1);
      expect((await stopDaemon(daemon)).code).to.equal(0);

      const truth = new Map(first.truth);
      for (const [sku, n] of second.truth) truth.set(sku, (truth.get(sku) ?? 0) + n);
      const onMaster = compare(await countsAt(redis.master.url, space.prefix), truth);
      expect(onMaster.exact, `below ${onMaster.below.join(',')}, above ${[...onMaster.excess.keys()].join(',')}`).to.equal(true);
      expect(compare(await countsAt(newReplica.url, space.prefix), truth).exact, 'and on the new replica').to.equal(true);
      console.log(
        `      named ${namedAfterMs} ms after the kill; ${held.unacked} deliveries held; ${waitRetries} WAIT retries logged; test ${Date.now() - started} ms`,
      );
    } finally {
      await newReplica?.stop();
      await redis.stop();
      await cleanup(space);
    }
  });
});
