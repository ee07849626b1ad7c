/**
 * Invariant 15 against the real broker and Redis: `tally dead replay` moves
 * back a dead letter that may have been counted only while its markers live
 * (replay-guard.ts). With TALLY_MARKER_TTL_S=5 (bucket width 3 s: a marker
 * lives 5 to 8 s):
 *
 * - fresh: count-refused dead letters replayed within the TTL find the
 *   markers of their other parts; only the refused part is counted;
 * - past it: the replay keeps them in place, in order, counts nothing, exits
 *   3 with one line naming --force and the overcount; bad messages of the
 *   same age are replayed (never counted, nothing to recount);
 * - --force: replayed, said on stderr, forced_replays moves, and they are
 *   counted again: exactly the overcount the line predicted.
 *
 * And the broker refusing a replayed copy (ReplayRefusedError), with the
 * broker's own x-death dead letters.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { Redis } from 'ioredis';
import { countKey, shardOf } from '@tally/shared';
import { generateWorkload, publishAll } from '@tally/workload';
import { listDeadLetters, replayDeadLetters, type ReplayReport } from '../../src/commands/dead-queue.js';
import { DeadLetterSummary } from '../../src/commands/dead-summary.js';
import {
  pinMarkerScope,
  cleanup,
  compare,
  countsOf,
  queueState,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  AMQP_URL,
  CLI,
  REDIS_URL,
  type TestSpace,
} from './harness.js';
import { runTool } from './ops-tools.js';
import { waitFor } from './runtime-probes.js';

interface Body {
  id: string;
  changes: Array<{ sku: string; delta: number }>;
}

/** The JSON shape of a report's RiskSummary. */
interface RiskJson {
  messages: number;
  units: number;
  byReason: Record<string, number>;
  countRefused: { messages: number; countedParts: number; countedUnits: number };
}
type ReplayJson = Omit<ReplayReport, 'refused' | 'forced'> & { refused: RiskJson; forced: RiskJson };

async function tally(env: Record<string, string>, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return runTool(process.execPath, [CLI, ...args], { env: { ...process.env, ...env } });
}

async function replay(env: Record<string, string>, ...flags: string[]): Promise<{ code: number; report: ReplayJson; stderr: string }> {
  const run = await tally(env, 'dead', 'replay', '--json', ...flags);
  expect(run.stdout, run.stderr).to.not.equal('');
  return { code: run.code, report: JSON.parse(run.stdout) as ReplayJson, stderr: run.stderr };
}

/** The dead queue's messages in order, as (id, reason). */
async function deadOrder(space: TestSpace): Promise<Array<[string | null, string]>> {
  const summary = await listDeadLetters({ url: AMQP_URL, deadQueue: `${space.queue}.dead` }, new DeadLetterSummary(null, 100_000));
  return summary.messages.map((m) => [m.id, m.reason]);
}

describe('dead replay and the age of markers (integration)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(120_000);

  it('count-refused dead letters: replayed fresh they find their markers; past the TTL refused and kept in order; --force counts them again, as predicted, and is counted', async () => {
    const virtualShards = 16;
    const ttlS = 5;
    const space = testSpace('replay-age', { TALLY_MARKER_TTL_S: String(ttlS), TALLY_BATCH_WAIT_MS: '10' });
    const redis = new Redis(REDIS_URL);
    let daemon: Awaited<ReturnType<typeof startDaemon>> | null = null;
    try {
      const workload = generateWorkload({ messages: 300, skus: 40, seed: 71, duplicateRate: 0, badRate: 0.03, idInPropertyShare: 0, idPrefix: space.queue });
      const poisoned = 'SKU-000007';
      const poisonShard = shardOf(poisoned, virtualShards);
      const poisonKey = countKey(space.prefix, poisonShard, poisoned);
      await redis.set(poisonKey, 'abc');
      const bodies = new Map(workload.publishes.filter((p) => p.kind === 'good').map((p) => [p.id!, JSON.parse(p.body.toString()) as Body]));
      const refused = [...bodies.values()].filter((b) => b.changes.some((c) => c.sku === poisoned && c.delta !== 0));
      const bad = workload.publishes.filter((p) => p.kind === 'bad');
      expect(refused.length, 'enough refused messages: 10 fresh, the rest stale').to.be.greaterThan(14);
      expect(bad.length, 'and some bad ones').to.be.greaterThan(3);
      const shardsOf = (b: Body) => new Set(b.changes.filter((c) => c.delta !== 0).map((c) => shardOf(c.sku, virtualShards)));

      daemon = await startDaemon(space.env);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitFor('the dead letters', async () => (await queueState(`${space.queue}.dead`)).messageCount === refused.length + bad.length, 30_000, 50);
      // Every marker of their counted parts was written before this instant.
      const deadBy = Date.now();
      await redis.del(poisonKey);

      // Fresh: the first 10 count-refused, replayed at once.
      const order = (await deadOrder(space)).filter(([, reason]) => reason === 'count-refused').map(([id]) => id!);
      const fresh = order.slice(0, 10).map((id) => bodies.get(id)!);
      const stale = order.slice(10).map((id) => bodies.get(id)!);
      const first = await replay(space.env, '--reason', 'count-refused', '--limit', '10');
      expect(first.code, first.stderr).to.equal(0);
      expect(first.report).to.include({ replayed: 10, markerLifeS: ttlS });
      expect(first.report.refused.messages).to.equal(0);
      expect(first.stderr).to.equal('');
      const freshMulti = fresh.filter((b) => shardsOf(b).size > 1).length;
      const expectedCounted = workload.good - refused.length + (fresh.length - freshMulti);
      await waitFor('the fresh copies counted', async () => (await statsOf(space.prefix)).counted >= expectedCounted, 20_000, 100);
      expect((await statsOf(space.prefix)).partial_duplicates, 'the fresh copies found the markers of their other parts').to.equal(freshMulti);
      const afterFresh = await countsOf(space.prefix, virtualShards);

      // Past the TTL: every marker of the first run has expired (bucket end + TTL <= write + 8 s).
      await sleep(Math.max(0, deadBy + (ttlS + Math.ceil(ttlS / 2)) * 1000 + 500 - Date.now()));
      const before = await deadOrder(space);
      const held = await replay(space.env);
      expect(held.code, 'exit 3: some kept back').to.equal(3);
      const lines = held.stderr.trim().split('\n');
      expect(lines, 'one line').to.have.length(1);
      expect(lines[0]).to.include('--force').and.include(`kept ${stale.length} dead letters`);
      const predictedUnits = stale.reduce(
        (sum, b) => sum + b.changes.filter((c) => shardOf(c.sku, virtualShards) !== poisonShard).reduce((s, c) => s + c.delta, 0),
        0,
      );
      expect(held.report.refused).to.deep.include({ messages: stale.length, units: predictedUnits, byReason: { 'count-refused': stale.length } });
      expect(lines[0]).to.include(`${predictedUnits} units`);
      expect(held.report.replayed, 'the bad messages, never counted, replay at any age').to.equal(bad.length);
      expect(held.report.forced.messages).to.equal(0);
      const kept = (await deadOrder(space)).slice(0, stale.length);
      expect(kept, 'kept in place, in order').to.deep.equal(before.filter(([, reason]) => reason === 'count-refused'));
      expect(await countsOf(space.prefix, virtualShards), 'nothing counted').to.deep.equal(afterFresh);

      const forced = await replay(space.env, '--reason', 'count-refused', '--force');
      expect(forced.code, forced.stderr).to.equal(0);
      expect(forced.stderr)
        .to.match(/^tally: FORCED: replayed \d+ dead letters/)
        .and.include('forced_replays');
      expect(forced.report).to.include({ replayed: stale.length });
      expect(forced.report.forced).to.deep.include({ messages: stale.length, units: predictedUnits });
      expect((await statsOf(space.prefix)).forced_replays, 'the forced counter').to.equal(stale.length);

      // Counted again, whole: no marker of theirs was left.
      await waitFor('the forced copies counted', async () => (await statsOf(space.prefix)).counted >= expectedCounted + stale.length, 20_000, 100);
      await waitFor('the bad ones dead-lettered again', async () => (await queueState(`${space.queue}.dead`)).messageCount === bad.length, 20_000, 100);
      const stats = await statsOf(space.prefix);
      expect(stats).to.include({ counted: expectedCounted + stale.length, partial_duplicates: freshMulti });
      const check = compare(await countsOf(space.prefix, virtualShards), workload.truth);
      expect(check.below, 'nothing lost').to.deep.equal([]);
      expect(check.excessUnits, 'the overcount the refusal predicted, no more').to.equal(predictedUnits);
    } finally {
      if (daemon !== null) await stopDaemon(daemon);
      redis.disconnect();
      await cleanup(space);
    }
  });

  it('count-refused dead letters replayed while still refused keep their first dead-lettering time: no later replay counts their other parts twice', async () => {
    // A replay before the key is repaired: the other parts are duplicates (markers alive, no new marker written), the
    // refused part fails again, and the message is dead-lettered again. Its markers still date from the first time.
    const virtualShards = 16;
    const ttlS = 5;
    const space = testSpace('replay-again', { TALLY_MARKER_TTL_S: String(ttlS), TALLY_BATCH_WAIT_MS: '10' });
    const redis = new Redis(REDIS_URL);
    const connection = await amqp.connect(AMQP_URL);
    let daemon: Awaited<ReturnType<typeof startDaemon>> | null = null;
    try {
      const poisoned = 'SKU-POISON';
      const other = ['SKU-A', 'SKU-B', 'SKU-C', 'SKU-D'].find((sku) => shardOf(sku, virtualShards) !== shardOf(poisoned, virtualShards))!;
      const poisonKey = countKey(space.prefix, shardOf(poisoned, virtualShards), poisoned);
      await redis.set(poisonKey, 'abc');
      const ids = [1, 2, 3].map((n) => `${space.queue}-m${n}`);
      daemon = await startDaemon(space.env);
      const channel = await connection.createConfirmChannel();
      for (const id of ids) {
        const body = {
          id,
          changes: [
            { sku: poisoned, delta: 1 },
            { sku: other, delta: 10 },
          ],
        };
        channel.sendToQueue(space.queue, Buffer.from(JSON.stringify(body)), { persistent: true });
      }
      await channel.waitForConfirms();
      const deadQueue = `${space.queue}.dead`;
      const allDead = async () => (await queueState(deadQueue)).messageCount === ids.length && (await queueState(space.queue)).messageCount === 0;
      await waitFor('the first dead-lettering', allDead, 30_000, 50);
      // Every marker of their counted parts was written before this instant, and is gone 8 s later (bucket end + TTL).
      const deadBy = Date.now();
      expect((await countsOf(space.prefix, virtualShards)).get(other)).to.equal(30);

      // Replayed again and again while the key is still foreign, each time within the marker lifetime of the last
      // dead-lettering, until the first run's markers have expired.
      const expiredBy = deadBy + (ttlS + Math.ceil(ttlS / 2)) * 1000 + 500;
      let replays = 0;
      let refusedAt: number | null = null;
      while (Date.now() < expiredBy) {
        const again = await replay(space.env, '--reason', 'count-refused');
        if (again.code === 3) {
          refusedAt ??= Date.now();
          // Each copy is judged by its own first dead-lettering time, milliseconds apart when they were dead-lettered
          // by different batches: a replay at the edge of the lifetime may keep some back and still move the rest.
          expect(again.report.replayed + again.report.refused.messages, again.stderr).to.equal(ids.length);
          if (again.report.replayed === 0) break;
        } else {
          expect(again.code, again.stderr).to.equal(0);
          expect(again.report.replayed).to.equal(ids.length);
          replays++;
        }
        await waitFor('dead-lettered again', allDead, 20_000, 50);
        await sleep(1_000);
      }
      expect(replays, 'replayed at least once while the markers lived').to.be.at.least(1);

      // The key repaired after the markers of the first run have expired: the replay must keep them back, naming the
      // other parts, rather than trust the time of the last dead-lettering and count those parts a second time.
      await sleep(Math.max(0, expiredBy - Date.now()));
      await redis.del(poisonKey);
      const late = await replay(space.env, '--reason', 'count-refused');
      // What a replay let through (here or in the loop) has been consumed by now.
      await waitFor('the work queue drained', async () => (await queueState(space.queue)).messageCount === 0, 20_000, 50);
      await sleep(1_000);
      expect((await countsOf(space.prefix, virtualShards)).get(other), 'the other parts counted once').to.equal(30);
      expect(refusedAt, 'refused once the first dead-lettering is older than the marker lifetime').to.not.equal(null);
      expect(refusedAt! - deadBy, 'not before the marker lifetime less the clock margin').to.be.at.least((ttlS - 1) * 1000 - 1_000);
      expect(late.code, late.stderr).to.equal(3);
      expect(late.report.refused).to.deep.include({ messages: ids.length, units: 30 });
      expect(late.report.refused.countRefused).to.deep.equal({ messages: ids.length, countedParts: ids.length, countedUnits: 30 });
      expect((await queueState(deadQueue)).messageCount, 'kept in place').to.equal(ids.length);
    } finally {
      if (daemon !== null) await stopDaemon(daemon);
      await connection.close().catch(() => {});
      redis.disconnect();
      await cleanup(space);
    }
  });

  it("the broker's own dead letters (x-death): a replayed copy the broker refuses moves nothing (ReplayRefusedError); past the TTL refused; fresh replayed", async () => {
    const space = testSpace('replay-broker');
    const deadQueue = `${space.queue}.dead`;
    const source = `${space.queue}.ttl`;
    const full = `${space.queue}.full`;
    const connection = await amqp.connect(AMQP_URL);
    try {
      const channel = await connection.createConfirmChannel();
      await channel.assertQueue(space.queue, { durable: true });
      await channel.assertQueue(deadQueue, { durable: true });
      // Expired at once, dead-lettered by the broker itself into <queue>.dead.
      await channel.assertQueue(source, {
        durable: false,
        arguments: { 'x-message-ttl': 1, 'x-dead-letter-exchange': '', 'x-dead-letter-routing-key': deadQueue },
      });
      // Takes nothing: the broker nacks every publish.
      await channel.assertQueue(full, { durable: false, arguments: { 'x-max-length': 0, 'x-overflow': 'reject-publish' } });
      const ids = ['e-1', 'e-2', 'e-3'];
      for (const id of ids) channel.sendToQueue(source, Buffer.from(JSON.stringify({ id, changes: [{ sku: 'A', delta: 1 }] })), { persistent: true });
      await channel.waitForConfirms();
      await waitFor('the broker to dead-letter them', async () => (await queueState(deadQueue)).messageCount === ids.length, 10_000, 20);
      const order = await deadOrder(space);
      expect(order).to.deep.equal(ids.map((id) => [id, 'expired']));

      const refusedCopy = await replayDeadLetters({ url: AMQP_URL, deadQueue, queue: full, reason: null, limit: 10 }).then(
        () => null,
        (error: unknown) => error,
      );
      expect(refusedCopy).to.have.property('code', 'TALLY_REPLAY_REFUSED');
      expect(await deadOrder(space), 'nothing moved, order kept').to.deep.equal(order);
      expect((await queueState(full)).messageCount).to.equal(0);

      // x-death's time has a resolution of a second: 2.1 s is past a 1 s TTL whatever the rounding.
      await sleep(2_100);
      const old = await replay({ ...space.env, TALLY_MARKER_TTL_S: '1' }, '--reason', 'expired');
      expect(old.code, old.stderr).to.equal(3);
      expect(old.report.refused).to.deep.include({ messages: 3, units: 3, byReason: { expired: 3 } });
      expect(await deadOrder(space)).to.deep.equal(order);

      const young = await replay({ ...space.env, TALLY_MARKER_TTL_S: '600' }, '--reason', 'expired');
      expect(young.code, young.stderr).to.equal(0);
      expect(young.report).to.include({ replayed: 3 });
      expect((await queueState(space.queue)).messageCount).to.equal(3);
      expect((await queueState(deadQueue)).messageCount).to.equal(0);
      await channel.deleteQueue(source);
      await channel.deleteQueue(full);
    } finally {
      await connection.close().catch(() => {});
      await cleanup(space);
    }
  });
});
