import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, layoutKey, markerDigest, type BatchResult, type BatchTask, type WorkerSettings } from '@tally/shared';
import { createRedisClient, type RedisClient } from '@tally/runtime';
import { markersDone, startPrivateRedis, startProxy, testWorkerSettings, writeDoneMarker, type PrivateRedis } from '@tally/testkit';
import { runAtomicBatch } from '../src/atomic-batch.js';
import type { BatchHooks, BatchLog } from '../src/batch-log.js';
import { BatchWritesLostError } from '../src/replica-wait.js';
import { runTwoStepBatch } from '../src/two-step-batch.js';

const quiet: BatchLog = { warn() {}, error() {} };
const WIDTH_S = 300;

function settingsFor(mode: WorkerSettings['mode'], prefix: string, url: string): WorkerSettings {
  return testWorkerSettings({ redisUrl: url, prefix, mode, markerBucketS: WIDTH_S, waitReplicas: 1, waitTimeoutMs: 200 });
}

/** Until `replica` has everything `master` had written when this was called. */
async function untilReplicated(master: Redis): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (Number(await master.call('WAIT', 1, 200)) >= 1) return;
    await sleep(100);
  }
  throw new Error('the replica never acknowledged');
}

/**
 * A batch acked on the strength of its markers must find every one of them
 * on the master whose replicas answer its WAIT. The failover: the old master
 * (no replica in reach: its WAIT times out) holds the markers of two
 * messages, m0 (old, replicated) and m1 (just set by another daemon that
 * then died, not replicated). A redelivered copy of both finds both there:
 * all duplicates. Its WAIT times out; the promoted replica, which has m0
 * only, answers the next WAIT. Acking now would lose m1's counts for good.
 */
describe('WAIT after a failover: every marker a batch relies on must be on the new master', function () {
  this.timeout(60_000);

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: an all-duplicate batch whose duplicate is missing on the promoted replica is rerun, and then counts it`, async () => {
      const runId = randomBytes(4).toString('hex');
      const prefix = `t.wait.${runId}:`;
      const vshard = 4;
      const task: BatchTask = {
        vshard,
        batchId: randomUUID(),
        ids: [`${runId}-m0`, `${runId}-m1`],
        changes: [[['A', 3]], [['B', 5]]],
      };
      const servers: PrivateRedis[] = [];
      const admins: Redis[] = [];
      let client: RedisClient | null = null;
      const proxy = await startProxy(0);
      try {
        const oldMaster = await startPrivateRedis();
        const promoted = await startPrivateRedis();
        const promotedReplica = await startPrivateRedis({ args: ['--replicaof', '127.0.0.1', String(promoted.port)] });
        servers.push(oldMaster, promoted, promotedReplica);
        const [oldAdmin, newAdmin] = [new Redis(oldMaster.url), new Redis(promoted.url)];
        admins.push(oldAdmin, newAdmin);
        const [m0, m1] = task.ids as [string, string];
        await writeDoneMarker(oldAdmin, { prefix, vshard, id: m0, widthS: WIDTH_S, markerTtlS: 600 });
        await writeDoneMarker(oldAdmin, { prefix, vshard, id: m1, widthS: WIDTH_S, markerTtlS: 600 });
        await writeDoneMarker(newAdmin, { prefix, vshard, id: m0, widthS: WIDTH_S, markerTtlS: 600 });
        // The layout a daemon would have recorded (markersDone reads the bucket width from it).
        await newAdmin.hset(layoutKey(prefix), 'marker_bucket_s', WIDTH_S);
        await untilReplicated(newAdmin);

        proxy.retarget(oldMaster.port);
        client = createRedisClient(`redis://127.0.0.1:${proxy.port}`, 'test');
        client.on('error', () => {});
        let failedOver = false;
        const hooks: BatchHooks = {
          onWaitTimeout: () => {
            if (failedOver) return;
            failedOver = true;
            proxy.retarget(promoted.port);
            proxy.cutAll();
          },
        };
        const settings = settingsFor(mode, prefix, `redis://127.0.0.1:${proxy.port}`);
        const run = (): Promise<BatchResult> => (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client!, settings, task, quiet, hooks);

        const error = await run().then(
          () => null,
          (e: unknown) => e,
        );
        expect(failedOver, 'the first WAIT timed out on the old master').to.equal(true);
        expect(error, 'not reported done: m1 is not on the new master').to.be.instanceOf(BatchWritesLostError);

        // The coordinator's rerun: m0 is a duplicate, m1 is counted now.
        const rerun = await run();
        expect([...rerun.marked]).to.deep.equal([1, 0]);
        expect(await newAdmin.get(countKey(prefix, vshard, 'A')), 'm0 counted by its first delivery only').to.equal(null);
        expect(await newAdmin.get(countKey(prefix, vshard, 'B'))).to.equal('5');
        expect(await markersDone(newAdmin, prefix, 600, [{ vshard, digest: markerDigest(m1) }])).to.deep.equal([true]);
      } finally {
        client?.disconnect();
        for (const admin of admins) admin.disconnect();
        await proxy.close();
        for (const server of servers.reverse()) await server.stop();
      }
    });
  }
});

/**
 * A batch that waits for its replicas longer than the marker TTL must not
 * see its own markers expire meanwhile: a rerun (or a redelivery after a
 * crash before the ack) would count its parts again. confirm_markers moves a
 * marker whose bucket expires within half the TTL into the bucket of now.
 */
describe('WAIT longer than the marker TTL: the markers the batch relies on are kept alive', function () {
  this.timeout(60_000);

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: markers outlive a WAIT that times out for twice the marker TTL`, async () => {
      const runId = randomBytes(4).toString('hex');
      const prefix = `t.renew.${runId}:`;
      const vshard = 2;
      const task: BatchTask = { vshard, batchId: randomUUID(), ids: [`${runId}-a`, `${runId}-b`], changes: [[['A', 1]], [['B', 2]]] };
      const ttlS = 4;
      const widthS = 2;
      const master = await startPrivateRedis();
      const replica = await startPrivateRedis();
      const admin = new Redis(master.url);
      const replicaAdmin = new Redis(replica.url);
      const client = createRedisClient(master.url, 'test');
      client.on('error', () => {});
      try {
        await admin.hset(layoutKey(prefix), 'marker_bucket_s', widthS);
        const settings: WorkerSettings = { ...settingsFor(mode, prefix, master.url), markerTtlS: ttlS, markerBucketS: widthS, waitTimeoutMs: 500 };
        let timeouts = 0;
        const startedAt = Date.now();
        // No replica yet: every WAIT times out. The replica is attached after 2 TTLs.
        const hooks: BatchHooks = {
          onWaitTimeout: () => {
            timeouts++;
            if (Date.now() - startedAt > 2 * ttlS * 1000 && timeouts < 1000) {
              timeouts = 1000;
              void replicaAdmin.replicaof('127.0.0.1', String(master.port)).catch(() => {});
            }
          },
        };
        const result = await (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client, settings, task, quiet, hooks);
        expect([...result.marked]).to.deep.equal([0, 0]);
        expect(Date.now() - startedAt, 'the WAIT held the batch past the TTL').to.be.above(2 * ttlS * 1000);
        const refs = task.ids!.map((id) => ({ vshard, digest: markerDigest(id) }));
        expect(await markersDone(admin, prefix, ttlS, refs), 'its markers are live when it returns').to.deep.equal([true, true]);
        // A redelivery now (a crash before the ack) is caught.
        const again = await (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(
          client,
          { ...settings, waitReplicas: 0 },
          { ...task, batchId: randomUUID() },
          quiet,
        );
        expect([...again.marked]).to.deep.equal([1, 1]);
        expect(await admin.get(countKey(prefix, vshard, 'B'))).to.equal('2');
      } finally {
        client.disconnect();
        admin.disconnect();
        replicaAdmin.disconnect();
        await replica.stop();
        await master.stop();
      }
    });
  }
});

/**
 * A server that refuses Tally's WAIT (an ACL without it) is a refusal of
 * Tally itself, as NOPERM is at every other step: retried in place, logged
 * with its class, until the fix. Before, the WAIT alone gave up on it, and
 * the batch went back to the coordinator as failed, to be rerun whole.
 */
describe('WAIT refused by the server (NOPERM): retried in place until the ACL is fixed', function () {
  this.timeout(60_000);

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: the batch waits, logs the refusal as fatal, and returns once WAIT is allowed, its counts written once`, async () => {
      const runId = randomBytes(4).toString('hex');
      const prefix = `t.noperm-wait.${runId}:`;
      const vshard = 3;
      const task: BatchTask = { vshard, batchId: randomUUID(), ids: [`${runId}-a`], changes: [[['A', 4]]] };
      const master = await startPrivateRedis();
      const replica = await startPrivateRedis();
      const admin = new Redis(master.url);
      const replicaAdmin = new Redis(replica.url);
      let client: RedisClient | null = null;
      try {
        await replicaAdmin.replicaof('127.0.0.1', String(master.port));
        await untilReplicated(admin);
        await admin.call('ACL', 'SETUSER', 'tally', 'on', '>pw', '~*', '+@all', '-wait');
        const url = `redis://tally:pw@127.0.0.1:${master.port}`;
        client = createRedisClient(url, 'test');
        client.on('error', () => {});
        const warnings: Array<Record<string, unknown>> = [];
        const log: BatchLog = { warn: (fields) => warnings.push(fields), error() {} };
        const batch = (mode === 'atomic' ? runAtomicBatch : runTwoStepBatch)(client, settingsFor(mode, prefix, url), task, log);
        const settled = batch.then(
          () => 'returned',
          (error: Error) => `failed: ${error.message}`,
        );
        await sleep(1_500);
        const refused = warnings.filter((fields) => fields.step === 'wait' && fields.failureClass === 'fatal');
        expect(refused.length, 'the NOPERM is logged, as a refusal of Tally').to.be.greaterThan(0);
        expect(String(refused[0]!.err)).to.match(/NOPERM/);
        expect(await Promise.race([settled, sleep(0).then(() => 'waiting')]), 'nothing acked while WAIT is refused').to.equal('waiting');
        await admin.call('ACL', 'SETUSER', 'tally', '+wait');
        expect(await settled).to.equal('returned');
        expect((await batch).marked[0], 'a new message').to.equal(0);
        expect(await admin.get(countKey(prefix, vshard, 'A')), 'counted once').to.equal('4');
      } finally {
        client?.disconnect();
        admin.disconnect();
        replicaAdmin.disconnect();
        await replica.stop();
        await master.stop();
      }
    });
  }
});
