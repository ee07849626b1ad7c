/**
 * Message-scoped markers (TALLY_MARKER_SCOPE=message) against the real
 * daemon, RabbitMQ and Redis: one marker per message on the shard of its
 * digest, every change counted on its own SKU's shard. Exact in both modes
 * with duplicates and bad messages; under SIGKILLs mid-stream atomic mode
 * stays exact and two-step loses nothing, its overcount within what the
 * killed daemons had in flight; a prefix keeps the scope it was laid out
 * with.
 */
import { expect } from 'chai';
import { generateWorkload, publishAll, type Publish } from '@tally/workload';
import { FILTERED_MARKER_FORMAT, layoutKey, MARKER_FORMAT, markerDigest, markerShardOf, MESSAGE_MARKER_FORMAT } from '@tally/shared';
import { readMarkers } from '@tally/testkit';
import {
  cleanup,
  compare,
  countsOf,
  drainWithDaemon,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  waitForReadyEmpty,
  withRedis,
  AMQP_URL,
  type TestSpace,
} from './harness.js';
import { killMidStream } from './scenarios.js';

const MESSAGE_SCOPE = { TALLY_MARKER_SCOPE: 'message' } as const;

function excessUnits(diff: ReturnType<typeof compare>): number {
  let units = 0;
  for (const value of diff.excess.values()) units += value;
  return units;
}

/** Units (positive deltas) of the `count` largest good messages: the most one kill's in-flight window can hold. */
function largestMessagesUnits(publishes: readonly Publish[], count: number): number {
  const units = publishes
    .filter((publish) => publish.kind === 'good')
    .map((publish) =>
      (JSON.parse(publish.body.toString('utf8')) as { changes: Array<{ delta: number }> }).changes.reduce((sum, change) => sum + change.delta, 0),
    );
  units.sort((a, b) => b - a);
  return units.slice(0, count).reduce((a, b) => a + b, 0);
}

describe('message-scoped markers (integration: real daemon, RabbitMQ and Redis)', function () {
  this.timeout(240_000);
  const spaces: TestSpace[] = [];
  function space(label: string, extra: Record<string, string>): TestSpace {
    const created = testSpace(label, { ...MESSAGE_SCOPE, ...extra });
    spaces.push(created);
    return created;
  }
  afterEach(async () => {
    for (const s of spaces.splice(0)) await cleanup(s);
  });

  for (const mode of ['two-step', 'atomic'] as const) {
    it(`${mode}: counts duplicates, copies in flight and bad messages exactly, with one marker per message on its digest's shard`, async () => {
      const s = space(`ms-exact-${mode}`, { TALLY_MODE: mode });
      const workload = generateWorkload({
        messages: 6_000,
        skus: 600,
        duplicateRate: 0.03,
        badRate: 0.01,
        seed: 31,
        idPrefix: s.queue,
        nearDuplicateShare: 0.5,
      });
      // Copies of the first 30 messages back to back: in flight together (invariant 4).
      const repeated = workload.publishes.filter((publish) => publish.kind === 'good').slice(0, 30);
      const daemon = await startDaemon(s.env);
      await publishAll([...repeated, ...workload.publishes], { url: AMQP_URL, queue: s.queue });
      await waitForReadyEmpty(s.queue);
      expect((await stopDaemon(daemon)).code).to.equal(0);

      const diff = compare(await countsOf(s.prefix), workload.truth);
      expect(diff.below, 'lost').to.deep.equal([]);
      expect(excessUnits(diff), 'overcount').to.equal(0);
      const stats = await statsOf(s.prefix);
      expect(stats.counted).to.equal(6_000);
      expect(stats.duplicates, 'injected duplicates and the in-flight copies').to.equal(workload.duplicates + 30);
      expect(stats.dead_lettered).to.equal(workload.publishes.filter((publish) => publish.kind === 'bad').length);
      expect(await withRedis((redis) => redis.hget(layoutKey(s.prefix), 'marker_format'))).to.equal(MESSAGE_MARKER_FORMAT);

      const { done } = await withRedis((redis) => readMarkers(redis, s.prefix));
      expect(done.size, 'one marker per counted message').to.equal(6_000);
      const shardOfDigest = new Map(
        workload.publishes
          .filter((publish) => publish.kind === 'good')
          .map((publish) => {
            const digest = markerDigest(publish.id!);
            return [digest.toString('hex'), markerShardOf(digest, 16)] as const;
          }),
      );
      for (const entry of done) {
        const [vshard, digest] = entry.split(':') as [string, string];
        expect(Number(vshard), `marker ${entry} on its digest's shard`).to.equal(shardOfDigest.get(digest));
      }
    });
  }

  for (const mode of ['atomic', 'two-step'] as const) {
    it(`${mode}: SIGKILLs mid-stream lose nothing; ${mode === 'atomic' ? 'no overcount' : 'the overcount stays within what each kill had in flight'}`, async () => {
      const prefetch = 200;
      const s = space(`ms-kills-${mode}`, { TALLY_MODE: mode, TALLY_BATCH_SIZE: '50', TALLY_PREFETCH: String(prefetch) });
      const cycles = 8;
      const workload = generateWorkload({ messages: 4_000, skus: 400, seed: 78, duplicateRate: 0.01, idPrefix: s.queue, maxChanges: 8, maxDelta: 9 });
      const killsMidStream = await killMidStream(s.env, s.queue, s.prefix, workload.publishes, cycles);
      const exits = await drainWithDaemon(s.env, s.queue);
      expect(exits.every((exit) => exit.code === 0)).to.equal(true);
      expect(killsMidStream, 'kills of a daemon that had written, while the stream flowed').to.be.at.least(6);

      const diff = compare(await countsOf(s.prefix), workload.truth);
      expect(diff.below, 'lost').to.deep.equal([]);
      const excess = excessUnits(diff);
      if (mode === 'atomic') expect(excess, 'overcount').to.equal(0);
      // A kill recounts at most the messages it had written and not marked: within its prefetch window.
      else expect(excess, 'overcount').to.be.at.most(cycles * largestMessagesUnits(workload.publishes, prefetch));
      console.log(`      ${cycles} SIGKILLs (${killsMidStream} mid-stream): lost 0, overcount ${excess} units`);
    });
  }

  it('a prefix keeps the scope it was laid out with, whatever a later daemon is configured with', async () => {
    const s = space('ms-keep', {});
    const workload = generateWorkload({ messages: 600, skus: 100, duplicateRate: 0, seed: 5, idPrefix: s.queue });
    await publishAll(workload.publishes.slice(0, 300), { url: AMQP_URL, queue: s.queue });
    await drainWithDaemon(s.env, s.queue);
    // A daemon configured for part-scoped markers on the message-scoped prefix uses the recorded scope.
    await publishAll([...workload.publishes.slice(0, 50), ...workload.publishes.slice(300)], { url: AMQP_URL, queue: s.queue });
    await drainWithDaemon({ ...s.env, TALLY_MARKER_SCOPE: 'part' }, s.queue);
    expect(await withRedis((redis) => redis.hget(layoutKey(s.prefix), 'marker_format'))).to.equal(MESSAGE_MARKER_FORMAT);
    const diff = compare(await countsOf(s.prefix), workload.truth);
    expect(diff.exact, 'the 50 redelivered messages found their message markers').to.equal(true);
    expect((await statsOf(s.prefix)).duplicates).to.equal(50);
    // TALLY_MARKER_SCOPE unset: a new prefix on a standalone Redis gets message-scoped markers...
    const unset = space('ms-default', { TALLY_MARKER_SCOPE: '' });
    await publishAll(workload.publishes.slice(0, 10), { url: AMQP_URL, queue: unset.queue });
    await drainWithDaemon(unset.env, unset.queue);
    expect(await withRedis((redis) => redis.hget(layoutKey(unset.prefix), 'marker_format'))).to.equal(MESSAGE_MARKER_FORMAT);
    // ...and a prefix laid out with part-scoped markers keeps them under a daemon that leaves it unset.
    const parts = space('ms-part', { TALLY_MARKER_SCOPE: 'part' });
    await publishAll(workload.publishes.slice(0, 20), { url: AMQP_URL, queue: parts.queue });
    await drainWithDaemon(parts.env, parts.queue);
    await publishAll(workload.publishes.slice(0, 30), { url: AMQP_URL, queue: parts.queue });
    const daemon = await startDaemon({ ...parts.env, TALLY_MARKER_SCOPE: '' });
    await waitForReadyEmpty(parts.queue);
    expect((await stopDaemon(daemon)).code).to.equal(0);
    expect(await withRedis((redis) => redis.hget(layoutKey(parts.prefix), 'marker_format'))).to.equal(FILTERED_MARKER_FORMAT);
    expect(
      daemon.logs.some((l) => l.includes('TALLY_MARKER_SCOPE differs')),
      'no warning when the scope is not set',
    ).to.equal(false);
    expect((await statsOf(parts.prefix)).duplicates, 'the 20 redelivered messages found their part markers').to.equal(20);
  });

  it('part scope: a new prefix keeps filters (its own format); one laid out unfiltered by an older build stays unfiltered, and both find every duplicate', async () => {
    const filterKeys = async (prefix: string): Promise<number> =>
      withRedis(async (redis) => (await redis.keys(`${prefix}mk:*`)).filter((key) => key.endsWith(':f')).length);
    for (const format of [FILTERED_MARKER_FORMAT, MARKER_FORMAT]) {
      const s = space(`pf-${format === MARKER_FORMAT ? 'old' : 'new'}`, { TALLY_MARKER_SCOPE: 'part', TALLY_MODE: 'atomic' });
      if (format === MARKER_FORMAT) {
        // What a build from before the filtered format recorded: its buckets carry no filter bits.
        await withRedis((redis) =>
          redis.hset(
            layoutKey(s.prefix),
            'virtual_shards',
            '16',
            'hash',
            'fnv1a32-utf8',
            'mode',
            'atomic',
            'created_at',
            'then',
            'marker_format',
            MARKER_FORMAT,
            'marker_bucket_s',
            '300',
            'marker_sub_buckets',
            '256',
          ),
        );
      }
      const workload = generateWorkload({ messages: 400, skus: 100, duplicateRate: 0, badRate: 0, seed: 7, idPrefix: s.queue });
      const messages = workload.publishes;
      await publishAll(messages, { url: AMQP_URL, queue: s.queue });
      await drainWithDaemon(s.env, s.queue);
      // Every message again: each must be found by its markers, through the filter or without one.
      await publishAll(messages, { url: AMQP_URL, queue: s.queue });
      await drainWithDaemon(s.env, s.queue);
      expect(await withRedis((redis) => redis.hget(layoutKey(s.prefix), 'marker_format'))).to.equal(format);
      if (format === MARKER_FORMAT) expect(await filterKeys(s.prefix), 'an unfiltered prefix gets no filter').to.equal(0);
      else expect(await filterKeys(s.prefix), 'a new part-scoped prefix keeps a filter per bucket').to.be.greaterThan(0);
      const stats = await statsOf(s.prefix);
      expect(stats.duplicates + stats.partial_duplicates, `${format}: every copy found`).to.equal(messages.length);
      expect(compare(await countsOf(s.prefix), workload.truth).exact, `${format}: counted once`).to.equal(true);
    }
  });
});
