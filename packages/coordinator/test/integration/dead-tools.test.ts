import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload, publishAll, type Publish } from '@tally/workload';
import { replayDeadLetters } from '../../src/commands/dead-queue.js';
import type { DeadListReport } from '../../src/commands/dead.js';
import type { ReplayReport } from '../../src/commands/dead-queue.js';
import { cleanup, compare, countsOf, drainWithDaemon, queueState, statsOf, testSpace, AMQP_URL, CLI, type TestSpace } from './harness.js';
import { runTool } from './ops-tools.js';

async function tally(space: TestSpace, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return runTool(process.execPath, [CLI, ...args], { env: { ...process.env, ...space.env } });
}

async function deadList(space: TestSpace, ...flags: string[]): Promise<DeadListReport> {
  const run = await tally(space, ['dead', 'list', '--json', '--limit', '100000', ...flags]);
  expect(run.code, run.stderr).to.equal(0);
  return JSON.parse(run.stdout) as DeadListReport;
}

/** The reason the daemon gives a publish at a given size limit, or null when it counts it. */
function expectedReason(publish: Publish, maxBytes: number): string | null {
  if (publish.body.byteLength === 0) return 'empty-body';
  if (publish.body.byteLength > maxBytes) return 'oversized-body';
  return publish.kind === 'bad' ? publish.reason! : null;
}

describe('dead-letter tools (integration: tally dead list / replay)', function () {
  this.timeout(240_000);

  it('a too-small TALLY_MAX_MESSAGE_BYTES dead-letters good messages; dead replay --reason oversized-body gets them counted exactly once; only the truly bad stay dead, in order', async () => {
    const small = 150;
    const space = testSpace('deadtools', { TALLY_MAX_MESSAGE_BYTES: String(small), TALLY_BATCH_WAIT_MS: '10' });
    try {
      const workload = generateWorkload({ messages: 600, skus: 60, seed: 12, duplicateRate: 0.05, badRate: 0.05, idPrefix: space.queue, maxBytes: 65_536 });
      const reasons = workload.publishes.map((p) => expectedReason(p, small));
      const oversized = reasons.filter((r) => r === 'oversized-body').length;
      const oversizedGood = workload.publishes.filter((p, i) => p.kind !== 'bad' && reasons[i] === 'oversized-body').length;
      expect(oversizedGood, 'good messages over the small limit').to.be.greaterThan(50);
      expect(workload.publishes.filter((p) => p.kind === 'good' && p.body.byteLength <= small).length, 'and some under it').to.be.greaterThan(50);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await drainWithDaemon(space.env, space.queue);

      const deadCount = reasons.filter((r) => r !== null).length;
      expect((await queueState(`${space.queue}.dead`)).messageCount).to.equal(deadCount);

      // Listing reads everything and gives it all back, in the same order.
      const first = await deadList(space);
      const second = await deadList(space);
      expect(first.total).to.equal(deadCount);
      expect(first.byReason['oversized-body']).to.equal(oversized);
      const expectedByReason: Record<string, number> = {};
      for (const r of reasons) if (r !== null) expectedByReason[r] = (expectedByReason[r] ?? 0) + 1;
      expect(first.byReason).to.deep.equal(expectedByReason);
      expect(second.messages, 'a second listing sees the same messages in the same order').to.deep.equal(first.messages);
      expect((await queueState(`${space.queue}.dead`)).messageCount, 'nothing lost by listing').to.equal(deadCount);
      expect(first.messages.map((m) => m.position)).to.deep.equal([...first.messages.keys()]);
      const goodIds = new Set(workload.publishes.filter((p) => p.kind !== 'bad').map((p) => p.id));
      expect(first.messages.filter((m) => m.reason === 'oversized-body' && goodIds.has(m.id!)).length, 'oversized good messages listed with their id').to.equal(
        oversizedGood,
      );

      const filtered = await deadList(space, '--reason', 'oversized-body', '--limit', '3');
      expect(filtered.messages).to.have.length(3);
      expect(filtered.messages.every((m) => m.reason === 'oversized-body')).to.equal(true);
      expect(filtered).to.include({ matching: oversized, total: deadCount });

      const text = await tally(space, ['dead', 'list']);
      expect(text.code).to.equal(0);
      expect(text.stdout).to.match(new RegExp(`oversized-body\\s+${oversized}`));

      // The operator raises the limit and replays the oversized ones.
      const right = { ...space.env, TALLY_MAX_MESSAGE_BYTES: '65536' };
      const replay = await tally(space, ['dead', 'replay', '--reason', 'oversized-body', '--json']);
      expect(replay.code, replay.stderr).to.equal(0);
      const report = JSON.parse(replay.stdout) as ReplayReport;
      expect(report.replayed).to.equal(oversized);
      expect(report.replayedByReason).to.deep.equal({ 'oversized-body': oversized });
      expect(report.kept).to.equal(deadCount - oversized);
      expect((await queueState(space.queue)).messageCount, 'the copies wait in the work queue').to.equal(oversized);
      await drainWithDaemon(right, space.queue);

      expect(compare(await countsOf(space.prefix), workload.truth).exact, 'every good message counted exactly once').to.equal(true);
      const final = await deadList(space);
      expect(final.total, 'only the truly bad messages stay dead').to.equal(workload.bad);
      const badReasons: Record<string, number> = {};
      for (const p of workload.publishes) if (p.kind === 'bad') badReasons[expectedReason(p, 65_536)!] = (badReasons[expectedReason(p, 65_536)!] ?? 0) + 1;
      expect(final.byReason).to.deep.equal(badReasons);
      // The ones never replayed kept their order, ahead of those that came back.
      const keptBefore = first.messages.filter((m) => m.reason !== 'oversized-body').map((m) => [m.id, m.reason]);
      expect(final.messages.slice(0, keptBefore.length).map((m) => [m.id, m.reason])).to.deep.equal(keptBefore);
      const stats = await statsOf(space.prefix);
      expect(stats.counted).to.equal(workload.good);
    } finally {
      await cleanup(space);
    }
  });

  it('a crash between the confirm and the ack duplicates one message at worst, which the markers catch; the rest is replayed by a second run', async () => {
    const space = testSpace('deadcrash', { TALLY_BATCH_WAIT_MS: '10' });
    const deadQueue = `${space.queue}.dead`;
    try {
      const workload = generateWorkload({ messages: 20, skus: 10, seed: 3, duplicateRate: 0, idPrefix: space.queue, idInPropertyShare: 0 });
      const connection = await amqp.connect(AMQP_URL);
      const channel = await connection.createConfirmChannel();
      await channel.assertQueue(space.queue, { durable: true });
      await channel.assertQueue(deadQueue, { durable: true });
      for (const p of workload.publishes) {
        channel.sendToQueue(deadQueue, p.body, { persistent: true, headers: { 'x-tally-reason': 'oversized-body: the body is 300 bytes, the limit is 150' } });
      }
      await channel.waitForConfirms();
      await connection.close();
      const ids = workload.publishes.map((p) => p.id);

      let confirmed = 0;
      const crash = replayDeadLetters({
        url: AMQP_URL,
        deadQueue,
        queue: space.queue,
        reason: 'oversized-body',
        limit: Number.MAX_SAFE_INTEGER,
        afterConfirm: () => {
          if (++confirmed === 3) throw new Error('simulated crash after the confirm, before the ack');
        },
      });
      await crash.then(
        () => expect.fail('the replay should have died'),
        (error: Error) => expect(error.message).to.match(/simulated crash/),
      );
      expect((await queueState(space.queue)).messageCount, 'three copies confirmed').to.equal(3);
      expect((await queueState(deadQueue)).messageCount, 'two removed, the third back').to.equal(18);
      const after = await deadList(space);
      expect(
        after.messages.map((m) => m.id),
        'the third is back at its place, the rest in order',
      ).to.deep.equal(ids.slice(2));

      const rerun = await tally(space, ['dead', 'replay', '--json']);
      expect(rerun.code, rerun.stderr).to.equal(0);
      expect((JSON.parse(rerun.stdout) as ReplayReport).replayed).to.equal(18);
      expect((await queueState(deadQueue)).messageCount).to.equal(0);
      await drainWithDaemon(space.env, space.queue);
      expect(compare(await countsOf(space.prefix), workload.truth).exact, 'counted exactly once').to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.duplicates, 'the one duplicate was caught').to.equal(1);
      expect(stats.counted).to.equal(20);
    } finally {
      await cleanup(space);
    }
  });

  it('refuses an unknown reason code (exit 64) and names a missing queue (exit 1)', async () => {
    const space = testSpace('deadusage');
    const usage = await tally(space, ['dead', 'list', '--reason', 'bogus']);
    expect(usage.code).to.equal(64);
    expect(usage.stderr).to.match(/--reason: expected one of .*oversized-body/);
    const missing = await tally(space, ['dead', 'replay']);
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.match(/does not exist/);
    const sub = await tally(space, ['dead', 'purge']);
    expect(sub.code).to.equal(64);
  });
});
