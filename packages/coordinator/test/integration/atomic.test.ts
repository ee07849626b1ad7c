/**
 * Atomic mode (TALLY_MODE=atomic) against the real daemon, RabbitMQ and Redis:
 * the core's exact-count, redelivery and crash tests repeated, then what only
 * atomic mode promises: no overcount after many SIGKILLs, none when two
 * daemons race true duplicates, a Redis restart that empties the script
 * cache, and the guard against switching a prefix's mode under live markers.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { generateWorkload, publishAll } from '@tally/workload';
import { layoutKey, markerScanPattern } from '@tally/shared';
import { readCounts } from '../../src/commands/counts.js';
import { readStats, readStatsReport } from '../../src/commands/stats.js';
import {
  cleanup,
  compare,
  countsOf,
  drainWithDaemon,
  keyCount,
  queueState,
  spawnDaemon,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  waitForReadyEmpty,
  withRedis,
  AMQP_URL,
  type DaemonProcess,
  type TestSpace,
} from './harness.js';
import { startPrivateRedis } from '@tally/testkit';
import { killMidStream, redeliveryUnderLoad } from './scenarios.js';

const ATOMIC = { TALLY_MODE: 'atomic' } as const;

const markerCount = (prefix: string): Promise<number> => keyCount(markerScanPattern(prefix));

/** A daemon expected to refuse its start; one that runs anyway is killed, and the test fails on its exit. */
async function exitedWithin(daemon: DaemonProcess, ms: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const timer = setTimeout(() => daemon.child.kill('SIGKILL'), ms);
  try {
    return await daemon.exited;
  } finally {
    clearTimeout(timer);
  }
}

function excessUnits(diff: ReturnType<typeof compare>): number {
  let units = 0;
  for (const value of diff.excess.values()) units += value;
  return units;
}

describe('atomic mode (integration: real daemon, RabbitMQ and Redis)', function () {
  this.timeout(240_000);
  const spaces: TestSpace[] = [];
  function space(label: string, extra: Record<string, string> = {}): TestSpace {
    const created = testSpace(label, { ...ATOMIC, ...extra });
    spaces.push(created);
    return created;
  }
  afterEach(async () => {
    for (const s of spaces.splice(0)) await cleanup(s);
  });

  it('counts 10,000 messages with 2% duplicate publishes exactly, and tally stats says occupation failures cannot happen', async () => {
    const s = space('a-exact');
    const workload = generateWorkload({ messages: 10_000, skus: 1_000, duplicateRate: 0.02, seed: 12, idPrefix: s.queue, nearDuplicateShare: 0.5 });
    const daemon = await startDaemon(s.env);
    await publishAll(workload.publishes, { url: AMQP_URL, queue: s.queue });
    await waitForReadyEmpty(s.queue);
    expect((await stopDaemon(daemon)).code).to.equal(0);

    const diff = compare(await countsOf(s.prefix), workload.truth);
    expect(diff.below, 'lost').to.deep.equal([]);
    expect([...diff.excess], 'overcounted').to.deep.equal([]);
    const stats = await statsOf(s.prefix);
    expect(stats.received).to.equal(10_200);
    expect(stats.duplicates).to.equal(200);
    expect(stats.counted).to.equal(10_000);
    const report = await withRedis((redis) => readStatsReport(redis, { prefix: s.prefix }));
    expect(report.mode).to.equal('atomic');
    expect(report.occupation_failures, 'not applicable, not a misleading 0').to.equal(null);
    expect(report.counted).to.equal(10_000);
    expect(await withRedis((redis) => redis.hget(layoutKey(s.prefix), 'mode'))).to.equal('atomic');
  });

  it('counts the same id once when its copies are in flight together', async () => {
    const s = space('a-inflight', { TALLY_BATCH_WAIT_MS: '400', TALLY_BATCH_SIZE: '10000' });
    const base = generateWorkload({ messages: 300, skus: 50, seed: 5, duplicateRate: 0, idPrefix: s.queue, idInPropertyShare: 0 });
    const publishes = [...base.publishes.slice(0, 20).flatMap((p) => [p, p, p]), ...base.publishes.slice(20)];
    await publishAll(publishes, { url: AMQP_URL, queue: s.queue });
    await drainWithDaemon(s.env, s.queue);
    const diff = compare(await countsOf(s.prefix), base.truth);
    expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
    const stats = await statsOf(s.prefix);
    expect(stats.duplicates).to.equal(40);
    expect(stats.counted).to.equal(300);
  });

  it('does not count twice what the broker redelivers after the connection is closed under load', () => redeliveryUnderLoad('a-redeliver', ATOMIC));

  it('loses nothing and overcounts nothing over 20+ SIGKILLs mid-stream', async () => {
    const s = space('a-kills', { TALLY_BATCH_SIZE: '100' });
    const cycles = 24;
    const workload = generateWorkload({ messages: 12_000, skus: 800, seed: 77, duplicateRate: 0.01, idPrefix: s.queue, maxChanges: 8, maxDelta: 9 });
    // The stream is driven by the kill loop: each kill lands on a daemon at work with messages arriving.
    const killsMidStream = await killMidStream(s.env, s.queue, s.prefix, workload.publishes, cycles);
    const kills = cycles;
    const exits = await drainWithDaemon(s.env, s.queue);
    expect(
      exits.every((e) => e.code === 0),
      'clean stops after the crashes',
    ).to.equal(true);

    expect(kills).to.be.at.least(20);
    expect(killsMidStream, 'kills of a daemon that had written, while the stream flowed').to.be.at.least(20);
    const diff = compare(await countsOf(s.prefix), workload.truth);
    expect(diff.below, 'lost').to.deep.equal([]);
    expect(excessUnits(diff), 'overcount').to.equal(0);
    console.log(`      ${kills} SIGKILLs (${killsMidStream} mid-stream after the daemon's first batch): lost 0, overcount 0`);
  });

  it('two daemons racing true duplicates: neither mode overcounts (atomic: one script; two-step: the pre-check claims)', async () => {
    const results: Record<string, { excess: number; below: number; stats: Awaited<ReturnType<typeof statsOf>> }> = {};
    for (const mode of ['atomic', 'two-step'] as const) {
      const s = space(`race-${mode}`, { TALLY_MODE: mode });
      const base = generateWorkload({ messages: 4_000, skus: 400, seed: 91, duplicateRate: 0, idPrefix: s.queue, idInPropertyShare: 0 });
      // Each message twice in a row: RabbitMQ deals consecutive messages to
      // the two consumers in turn, so the copies reach different daemons at
      // the same moment, where no in-process check can see both.
      const doubled = base.publishes.flatMap((p) => [p, p]);
      const first = await startDaemon(s.env);
      const second = await startDaemon(s.env);
      await publishAll(doubled, { url: AMQP_URL, queue: s.queue });
      await waitForReadyEmpty(s.queue);
      await sleep(500);
      expect((await stopDaemon(first)).code).to.equal(0);
      expect((await stopDaemon(second)).code).to.equal(0);
      expect((await queueState(s.queue)).messageCount).to.equal(0);
      const diff = compare(await countsOf(s.prefix), base.truth);
      results[mode] = { excess: excessUnits(diff), below: diff.below.length, stats: await statsOf(s.prefix) };
      expect(diff.below, `${mode}: lost`).to.deep.equal([]);
      expect(results[mode]!.stats.received, `${mode}: both copies of every message were delivered`).to.equal(8_000);
    }
    expect(results.atomic!.excess, 'atomic: overcount').to.equal(0);
    // A message whose parts span shards can be split between the racers
    // (each counts some parts, finds the others marked): partial duplicates
    // then, but every part still counted exactly once.
    const atomicStats = results.atomic!.stats;
    expect(atomicStats.counted + atomicStats.duplicates + atomicStats.partial_duplicates).to.equal(8_000);
    // Per id: one copy counted and the other a duplicate, or both copies
    // partial. Never one counted and the other partial: that would mean
    // the same part counted by both.
    expect(atomicStats.counted + atomicStats.partial_duplicates / 2, 'each id counted once, whole or in parts').to.equal(4_000);
    // Two-step: the pre-check claims the parts it finds new, so the other
    // daemon's copy is held back until they are marked, and then is a duplicate.
    expect(results['two-step']!.stats.received, 'two-step was measured').to.equal(8_000);
    const twoStep = results['two-step']!;
    expect(twoStep.excess, 'two-step: overcount').to.equal(0);
    expect(twoStep.stats.occupation_failures ?? 0, 'two-step: no crash window fired').to.equal(0);
    console.log(
      `      two daemons, 4,000 ids published twice: atomic overcount 0 units; two-step overcount ${twoStep.excess} units ` +
        `(counted ${twoStep.stats.counted}, duplicates caught ${twoStep.stats.duplicates} of 4,000, parts held by a claim ${twoStep.stats.claim_holds ?? 0}); ` +
        `atomic counted ${atomicStats.counted}, duplicates ${atomicStats.duplicates}, partial ${atomicStats.partial_duplicates}`,
    );
  });

  it('reloads its script after a Redis crash and restart mid-run, and loses nothing', async () => {
    const redisServer = await startPrivateRedis({ durable: true });
    const s = space('a-reload', { TALLY_REDIS_URL: redisServer.url, TALLY_BATCH_SIZE: '200', TALLY_WORKERS: '2' });
    const redis = new Redis(redisServer.url);
    redis.on('error', () => {});
    try {
      const workload = generateWorkload({ messages: 15_000, skus: 600, seed: 23, duplicateRate: 0.01, idPrefix: s.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: s.queue });
      const daemon = await startDaemon(s.env);
      // Crash Redis once both threads (even and odd shards) have run the
      // script, so each has it loaded, with messages still queued.
      const deadline = Date.now() + 10_000;
      const shardsWritten = new Set<number>();
      while (Date.now() < deadline && !(shardsWritten.has(0) && shardsWritten.has(1))) {
        const [, keys] = await redis.scan('0', 'MATCH', markerScanPattern(s.prefix), 'COUNT', 10_000);
        for (const key of keys) shardsWritten.add(Number(/\{(\d+)\}/.exec(key)![1]) % 2);
        await sleep(10);
      }
      expect([...shardsWritten].sort(), 'both threads wrote before the crash').to.deep.equal([0, 1]);
      expect((await queueState(s.queue)).messageCount, 'Redis goes down mid-run').to.be.greaterThan(0);
      await redisServer.crashAndRestart(700);
      await daemon.waitForLog('redis lost the atomic batch script', 30_000);
      await waitForReadyEmpty(s.queue);
      await sleep(500);
      expect((await stopDaemon(daemon)).code).to.equal(0);

      const raw = await readCounts(redis, { prefix: s.prefix, virtualShards: 16 }, []);
      const diff = compare(new Map([...raw].map(([sku, v]) => [sku, Number(v)])), workload.truth);
      expect(diff.below, 'lost').to.deep.equal([]);
      expect(excessUnits(diff), 'overcount').to.equal(0);
      const stats = await readStats(redis, { prefix: s.prefix });
      expect(stats.write_retries, 'batches waited out the outage').to.be.greaterThan(0);
      const reloads = daemon.logs.filter((l) => l.includes('redis lost the atomic batch script')).length;
      console.log(`      redis SIGKILLed and restarted mid-run: ${reloads} script reloads logged, ${stats.write_retries} batch retries, lost 0, overcount 0`);
    } finally {
      redis.disconnect();
      await redisServer.stop();
    }
  });

  it('refuses to switch a prefix to the other mode while its markers are live, and allows it once they expired', async () => {
    const twoStep = space('a-switch', { TALLY_MODE: 'two-step', TALLY_MARKER_TTL_S: '3' });
    const atomic = { ...twoStep.env, TALLY_MODE: 'atomic', TALLY_MARKER_TTL_S: '600' };
    const workload = generateWorkload({ messages: 200, skus: 20, seed: 8, duplicateRate: 0, idPrefix: twoStep.queue });
    await publishAll(workload.publishes, { url: AMQP_URL, queue: twoStep.queue });
    await drainWithDaemon(twoStep.env, twoStep.queue);
    expect(await markerCount(twoStep.prefix), 'two-step markers live').to.be.greaterThan(0);

    const refused = spawnDaemon(atomic);
    const exit = await exitedWithin(refused, 30_000);
    expect(exit.code, 'start refused').to.equal(1);
    const stderr = refused.stderr.join('');
    expect(stderr).to.include('TALLY_MODE is atomic');
    expect(stderr).to.include('two-step mode');
    expect(stderr).to.match(/markers are still live/);
    expect(
      refused.logs.some((l) => l.includes('TALLY_MODE_MISMATCH')),
      'stable error code logged',
    ).to.equal(true);
    expect(await withRedis((redis) => redis.hget(layoutKey(twoStep.prefix), 'mode'))).to.equal('two-step');

    // The markers expire (TTL 3 s): the switch is allowed and recorded.
    const deadline = Date.now() + 20_000;
    while ((await markerCount(twoStep.prefix)) > 0 && Date.now() < deadline) await sleep(250);
    expect(await markerCount(twoStep.prefix)).to.equal(0);
    const switched = await startDaemon(atomic);
    expect(await withRedis((redis) => redis.hget(layoutKey(twoStep.prefix), 'mode'))).to.equal('atomic');
    // The same messages again: their markers are gone, so they count again, as any redelivery past the marker TTL would.
    await publishAll(workload.publishes.slice(0, 50), { url: AMQP_URL, queue: twoStep.queue });
    await waitForReadyEmpty(twoStep.queue);
    await sleep(300);
    expect((await stopDaemon(switched)).code).to.equal(0);

    // And back: atomic markers are live now, so two-step is refused in turn.
    const back = spawnDaemon(twoStep.env);
    expect((await exitedWithin(back, 30_000)).code).to.equal(1);
    expect(back.stderr.join('')).to.include('TALLY_MODE is two-step');
  });
});
