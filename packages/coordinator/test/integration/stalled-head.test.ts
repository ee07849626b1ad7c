/**
 * Case 5 of "Never silently wrong": one delivery that can never finish must
 * not hold back the finished ones behind it. A private redis-server with an
 * ACL user whose key patterns leave out virtual shard 5 makes every part on
 * that shard fail (NOPERM) while the other shards write; the deliveries with
 * no part on shard 5 must be acked (single acks) once the head has been stuck
 * for TALLY_STALL_MS, the oldest-unacked gauge must grow and /readyz must say
 * "stalled". Then the ACL is fixed and everything finishes exactly.
 *
 * The same holds at once, without TALLY_STALL_MS, for a head held by another
 * daemon's live claim (two-step): the claim of a daemon killed between its
 * pre-check and its occupation holds its messages up to
 * TALLY_MARKER_CLAIM_TTL_S, and the messages behind them must flow meanwhile.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { publishAll, type Publish } from '@tally/workload';
import { layoutKey, shardOf } from '@tally/shared';
import { pinMarkerScope, cleanup, compare, countsOf, startDaemon, statsOf, stopDaemon, testSpace, withRedis, AMQP_URL, type DaemonProcess } from './harness.js';
import { asAdmin, startPrivateRedis, writeClaim } from '@tally/testkit';
import { brokerQueue, countsAt, metricsText, readyz, sample, waitFor } from './runtime-probes.js';

const STUCK_SHARD = 5;

describe('a stalled head (integration: private redis-server with a narrow ACL, real RabbitMQ)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(240_000);

  it('RabbitMQ: a multiple-ack may span singly acked tags, but an ack naming an acked tag closes the channel', async () => {
    // The two facts AckTracker relies on (ack-tracker.ts), checked against the real broker.
    const connection = await amqp.connect(AMQP_URL);
    const queue = `t.acks.${Date.now().toString(36)}`;
    try {
      const trial = async (acks: Array<[tag: number, multiple: boolean]>): Promise<string | null> => {
        const channel = await connection.createChannel();
        let closedWith: string | null = null;
        channel.on('error', (error: Error) => (closedWith = error.message));
        await channel.assertQueue(queue, { durable: false });
        await channel.purgeQueue(queue);
        for (let i = 0; i < 5; i++) channel.sendToQueue(queue, Buffer.from(String(i)));
        await channel.prefetch(10);
        const received: number[] = [];
        await channel.consume(queue, (message) => received.push(message!.fields.deliveryTag));
        await waitFor('5 deliveries', async () => received.length === 5, 10_000, 20);
        for (const [tag, multiple] of acks) channel.ack({ fields: { deliveryTag: tag } } as amqp.Message, multiple);
        await sleep(500);
        if (closedWith === null) await channel.close();
        return closedWith;
      };
      expect(
        await trial([
          [2, false],
          [4, false],
          [3, true],
          [5, true],
        ]),
        'single 2 and 4, then multiple 3 and 5',
      ).to.equal(null);
      expect(
        await trial([
          [2, false],
          [2, true],
        ]),
        'multiple naming the acked 2',
      ).to.match(/PRECONDITION_FAILED - unknown delivery tag 2/);
      expect(
        await trial([
          [2, false],
          [2, false],
        ]),
        'single 2 twice',
      ).to.match(/PRECONDITION_FAILED - unknown delivery tag 2/);
    } finally {
      const channel = await connection.createChannel();
      await channel.deleteQueue(queue).catch(() => {});
      await connection.close();
    }
  });

  it("a head held by a dead daemon's live claim: the deliveries behind it are acked at once, it is counted once the claim runs out", async () => {
    const claimTtlS = 8;
    const prefetch = 50;
    const space = testSpace('claimhead', {
      TALLY_MARKER_CLAIM_TTL_S: String(claimTtlS),
      TALLY_PREFETCH: String(prefetch),
      TALLY_BATCH_WAIT_MS: '20',
      TALLY_VIRTUAL_SHARDS: '16',
    });
    let daemon: DaemonProcess | null = null;
    try {
      const truth = new Map<string, number>();
      const publishes: Publish[] = [];
      for (let n = 0; n < 400; n++) {
        const id = `${space.queue}-${n}`;
        const changes = [
          { sku: `SKU-${(n * 7) % 300}`, delta: 1 + (n % 5) },
          { sku: `SKU-${(n * 13 + 1) % 300}`, delta: 2 },
        ];
        for (const change of changes) truth.set(change.sku, (truth.get(change.sku) ?? 0) + change.delta);
        publishes.push({ kind: 'good', id, body: Buffer.from(JSON.stringify({ id, changes })) });
      }
      daemon = await startDaemon(space.env);
      // The first message's parts claimed just now by a daemon that died: no counts, no marker, a live claim.
      const [head] = publishes;
      const headChanges = (JSON.parse(head!.body.toString()) as { changes: Array<{ sku: string; delta: number }> }).changes;
      const headShards = [...new Set(headChanges.map((change) => shardOf(change.sku, 16)))];
      await withRedis(async (redis) => {
        const widthS = Number(await redis.hget(layoutKey(space.prefix), 'marker_bucket_s'));
        for (const vshard of headShards) await writeClaim(redis, { prefix: space.prefix, vshard, id: head!.id!, widthS, markerTtlS: 600 }, 'deadbeefdeadbeef');
      });
      const claimedAt = Date.now();
      await publishAll(publishes, { url: AMQP_URL, queue: space.queue });

      // Before the claim runs out, everything but the held head is counted and acked: the window did not fill behind it.
      await waitFor(
        'every delivery but the held head acked',
        async () => {
          const state = await brokerQueue(space.queue);
          return state.ready === 0 && state.unacked === 1 ? state : null;
        },
        claimTtlS * 1000,
        100,
      );
      const flowedMs = Date.now() - claimedAt;
      expect(flowedMs, `acked behind the held head in ${flowedMs} ms, before the claim TTL`).to.be.below(claimTtlS * 1000);
      // The one unacked delivery is the held head, and it alone: every other message is counted, exactly.
      const withoutHead = new Map(truth);
      for (const { sku, delta } of headChanges) withoutHead.set(sku, withoutHead.get(sku)! - delta);
      for (const [sku, n] of withoutHead) if (n === 0) withoutHead.delete(sku);
      const meanwhile = compare(await countsOf(space.prefix), withoutHead);
      expect([...meanwhile.excess.keys()], 'nothing above the truth').to.deep.equal([]);
      expect(meanwhile.below, 'everything but the head counted').to.deep.equal([]);

      // The claim runs out: the head is taken over, counted once, and the queue drains.
      await waitFor(
        'the held head counted once its claim ran out',
        async () => {
          const state = await brokerQueue(space.queue);
          return state.ready === 0 && state.unacked === 0;
        },
        claimTtlS * 1000 + 30_000,
        250,
      );
      expect(Date.now() - claimedAt, 'the head waited for the claim').to.be.at.least(claimTtlS * 1000 - 1_000);
      expect(
        daemon.logs.filter((l) => /"msg":"stalled|PRECONDITION|amqp channel error/.test(l)),
        'no stall reported, no channel error',
      ).to.deep.equal([]);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const end = compare(await countsOf(space.prefix), truth);
      expect(end.exact, `below ${end.below.length}, above ${end.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.claim_holds, 'the head was held').to.be.greaterThan(0);
      expect(stats.claim_takeovers, 'and taken over, part by part').to.equal(headShards.length);
    } finally {
      if (daemon && daemon.child.exitCode === null && daemon.child.signalCode === null) daemon.child.kill('SIGKILL');
      await cleanup(space).catch(() => {});
    }
  });

  it('acks the finished deliveries behind a stuck one, reports the stall, and counts exactly once the stuck one can finish', async () => {
    const server = await startPrivateRedis({ args: ['--maxmemory-policy', 'noeviction'] });
    const stallMs = 2_000;
    const space = testSpace('stall', { TALLY_METRICS_PORT: '0', TALLY_STALL_MS: String(stallMs), TALLY_BATCH_WAIT_MS: '20', TALLY_VIRTUAL_SHARDS: '16' });
    const p = space.prefix;
    // Every family of the prefix except the keys of shard 5: `<prefix>c:{5}:…`, `mk:{5}:…`, `w:{5}:…`.
    const keyPatterns = [`~${p}stats`, `~${p}layout`, `~${p}daemon:*`, `~${p}?:{[0-46-9]}*`, `~${p}?:{1[0-9]}*`, `~${p}mk:{[0-46-9]}*`, `~${p}mk:{1[0-9]}*`];
    await asAdmin(server, (admin) =>
      // +time: the layout check's script reads the server clock (layout-guard.ts).
      admin.call('ACL', 'SETUSER', 'tally', 'on', '>pw', ...keyPatterns, '+@read', '+@write', '+@scripting', '+@connection', '+info', '+time'),
    );
    const url = `redis://tally:pw@127.0.0.1:${server.port}`;
    const env = { ...space.env, TALLY_REDIS_URL: url };
    let daemon: DaemonProcess | null = null;
    try {
      // 400 messages; 4 of them (at positions 0, 100, 200, 300) carry a change on shard 5 and can never finish until the ACL is fixed.
      const skus = Array.from({ length: 2_000 }, (_, i) => `SKU-${i}`);
      const stuckSkus = skus.filter((sku) => shardOf(sku, 16) === STUCK_SHARD);
      const freeSkus = skus.filter((sku) => shardOf(sku, 16) !== STUCK_SHARD);
      const truth = new Map<string, number>();
      const publishes: Publish[] = [];
      const stuckIds: string[] = [];
      for (let n = 0; n < 400; n++) {
        const id = `${space.queue}-${n}`;
        const changes = [
          { sku: freeSkus[(n * 7) % freeSkus.length]!, delta: 1 + (n % 5) },
          { sku: freeSkus[(n * 13 + 1) % freeSkus.length]!, delta: 2 },
        ];
        if (n % 100 === 0) {
          changes.push({ sku: stuckSkus[n / 100]!, delta: 3 });
          stuckIds.push(id);
        }
        for (const change of changes) truth.set(change.sku, (truth.get(change.sku) ?? 0) + change.delta);
        publishes.push({ kind: 'good', id, body: Buffer.from(JSON.stringify({ id, changes })) });
      }
      await publishAll(publishes, { url: AMQP_URL, queue: space.queue });
      daemon = await startDaemon(env);
      const port = Number(JSON.parse(await daemon.waitForLog('http endpoint listening')).port);

      // Past the threshold, the broker's unacked count falls to the stuck deliveries alone.
      await waitFor(
        'only the stuck deliveries unacked',
        async () => {
          const state = await brokerQueue(space.queue);
          return state.ready === 0 && state.unacked === stuckIds.length ? state : null;
        },
        60_000,
        250,
      );
      await daemon.waitForLog('stalled: the oldest unacked delivery has not finished', 5_000);

      const text = await metricsText(port);
      expect(sample(text, 'tally_deliveries_in_flight'), "the daemon's own account: the stuck deliveries, as the broker says").to.equal(stuckIds.length);
      const first = sample(text, 'tally_oldest_unacked_age_seconds');
      await sleep(1_500);
      const second = sample(await metricsText(port), 'tally_oldest_unacked_age_seconds');
      expect(first, 'gauge past the threshold').to.be.at.least(stallMs / 1000);
      expect(second!, 'the gauge grows').to.be.greaterThan(first!);
      const answer = await readyz(port);
      expect(answer.code).to.equal(503);
      expect(answer.body.reason).to.match(/stalled: oldest unacked delivery \d+ s old/);
      expect(answer.body.reason, 'the cause comes first').to.match(/^redis refusing writes: NOPERM/);
      // The finished ones are counted; nothing is above the truth; the stuck shard holds nothing yet.
      const midway = compare(await countsAt(`redis://127.0.0.1:${server.port}`, p), truth);
      expect([...midway.excess.keys()], 'nothing above the truth').to.deep.equal([]);
      expect(
        midway.below.filter((sku) => shardOf(sku, 16) !== STUCK_SHARD),
        'every other shard complete',
      ).to.deep.equal([]);

      // Fix the ACL: the stuck parts finish at their next retry, and every ack goes out without a channel error.
      await asAdmin(server, (admin) => admin.call('ACL', 'SETUSER', 'tally', `~${p}*`));
      await waitFor(
        'the queue drained',
        async () => {
          const state = await brokerQueue(space.queue);
          return state.ready === 0 && state.unacked === 0;
        },
        60_000,
        250,
      );
      await daemon.waitForLog('stall over', 10_000);
      await waitFor('/readyz 200 again', async () => (await readyz(port)).code === 200, 10_000, 100);
      expect(
        daemon.logs.filter((l) => /PRECONDITION|amqp channel error|left to redelivery/.test(l)),
        'no channel error, no lost channel',
      ).to.deep.equal([]);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const end = compare(await countsAt(`redis://127.0.0.1:${server.port}`, p), truth);
      expect(end.exact, `below ${end.below.length}, above ${end.excess.size}`).to.equal(true);
    } finally {
      if (daemon && daemon.child.exitCode === null && daemon.child.signalCode === null) daemon.child.kill('SIGKILL');
      await cleanup(space).catch(() => {});
      await server.stop();
    }
  });
});
