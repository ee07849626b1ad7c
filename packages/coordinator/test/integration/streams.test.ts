/**
 * TALLY_SOURCE=stream against real RabbitMQ streams, a real Redis and real
 * daemon processes: exact counts with producer duplicates and bad messages
 * over 8 partitions and 3 daemons; two daemons reading every partition at
 * once (the handover overlap, held open); SIGKILLs mid-stream; a Redis that
 * comes back from an older snapshot (lost acknowledged writes, WAIT 0); a
 * retention cut past the checkpoint; a stream deleted and recreated.
 */
import { mkdtemp, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { describeTruthCheck, generateWorkload, publishAll, type Workload } from '@tally/workload';
import { resetNamespace, startPrivateRedis } from '@tally/testkit';
import { listDaemons, type LiveDaemon } from '../../src/fleet/heartbeat.js';
import {
  compare,
  countsOf,
  killDaemon,
  spawnDaemon,
  startDaemon,
  statsOf,
  stopDaemon,
  withRedis,
  AMQP_URL,
  REDIS_URL,
  type DaemonProcess,
  type TestSpace,
} from './harness.js';
import { tallyCli, until } from './fleet-helpers.js';
import { countsAt, metricsText, sample } from './runtime-probes.js';
import { caughtUp, checkpointsOf, streamBounds, streamSpace } from './stream-helpers.js';

type StreamSpace = ReturnType<typeof streamSpace>;

function workloadFor(space: TestSpace, messages: number, seed: number, badRate = 0.01): Workload {
  return generateWorkload({ messages, skus: 400, seed, duplicateRate: 0.03, badRate, idPrefix: space.queue, maxChanges: 6, maxDelta: 9 });
}

async function liveDaemons(prefix: string): Promise<LiveDaemon[]> {
  return withRedis((redis) => listDaemons([redis], prefix));
}

/** Every partition held by exactly one consuming daemon, `daemons` of them. */
async function balanced(space: StreamSpace, daemons: number): Promise<LiveDaemon[] | undefined> {
  const live = (await liveDaemons(space.prefix)).filter((d) => !d.leaving && d.consuming);
  if (live.length !== daemons) return undefined;
  const held = live.flatMap((d) => d.partitions).sort((a, b) => a - b);
  return held.join(',') === Array.from({ length: space.partitions }, (_, p) => p).join(',') ? live : undefined;
}

async function cleanupStreams(space: StreamSpace): Promise<void> {
  await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: space.partitions });
}

describe('stream source (integration: RabbitMQ streams, TALLY_SOURCE=stream)', function () {
  this.timeout(300_000);

  it('8 partitions, 3 daemons, producer duplicates and bad messages: exact, each id counted once, nothing read twice', async () => {
    const space = streamSpace('stream-exact', 8);
    const daemons: DaemonProcess[] = [];
    try {
      daemons.push(await startDaemon({ ...space.env, TALLY_METRICS_PORT: '0' }));
      for (let i = 1; i < 3; i++) daemons.push(await startDaemon(space.env));
      // Every partition held is not yet a fair share: a daemon may hold 4 until it sees the third one, so wait for both.
      const fair = async (): Promise<LiveDaemon[] | undefined> => {
        const live = await balanced(space, 3);
        return live?.every((d) => d.partitions.length >= 2 && d.partitions.length <= 3) ? live : undefined;
      };
      const live = await until('8 streams over 3 daemons, 2 or 3 each', fair, 30_000);
      for (const d of live) expect(d.partitions.length, d.id).to.be.within(2, 3);
      const workload = workloadFor(space, 3_000, 81);
      // Through the CLI, as an operator would: tally publish goes to the exchange, keyed by id.
      const truthFile = join(await mkdtemp(join(tmpdir(), 'tally-stream-')), 'truth.json');
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue, partitions: space.partitions });
      const published = await tallyCli(
        space.env,
        'publish',
        '--messages',
        '200',
        '--skus',
        '50',
        '--seed',
        '9',
        '--id-prefix',
        `${space.queue}.cli`,
        '--truth',
        truthFile,
      );
      expect(published.code, published.stderr).to.equal(0);
      const cli = JSON.parse(await readFile(truthFile, 'utf8')) as {
        published: number;
        good: number;
        duplicates: number;
        bad: number;
        counts: Record<string, number>;
      };
      const cliTruth = new Map(Object.entries(cli.counts));
      await caughtUp(space);
      // The first daemon's /metrics: per partition it holds, the stream's offsets and the lag, caught up.
      const port = Number((JSON.parse(await daemons[0]!.waitForLog('http endpoint listening')) as { port: number }).port);
      const held = live.find((d) => d.pid === daemons[0]!.child.pid)!.partitions;
      await until(
        'the gauges caught up',
        async () => {
          const text = await metricsText(port);
          return held.every((p) => sample(text, 'tally_stream_lag', { partition: String(p) }) === 0) ? text : undefined;
        },
        20_000,
      );
      const text = await metricsText(port);
      for (const p of held) {
        const committed = sample(text, 'tally_stream_committed_offset', { partition: String(p) });
        expect(committed, `partition ${p}`).to.equal(sample(text, 'tally_stream_last_offset', { partition: String(p) }));
        expect(sample(text, 'tally_stream_lag_seconds', { partition: String(p) })).to.equal(0);
      }
      expect(sample(text, 'tally_stream_rollbacks_total')).to.equal(0);
      for (const d of daemons) expect((await stopDaemon(d)).code).to.equal(0);
      const truth = new Map(workload.truth);
      for (const [sku, n] of cliTruth) truth.set(sku, (truth.get(sku) ?? 0) + n);
      const check = compare(await countsOf(space.prefix), truth);
      expect(check.exact, `SKUs off their truth: ${check.below.length} below, ${check.excess.size} above`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.received, 'every publish read once').to.equal(workload.publishes.length + cli.published);
      expect(stats.duplicates, 'producer duplicates caught by the id window').to.equal(workload.duplicates + cli.duplicates);
      expect(stats.dead_lettered).to.equal(workload.bad + cli.bad);
      expect(stats.counted).to.equal(workload.good + cli.good);
      expect(stats.replayed ?? 0).to.equal(0);
      expect(stats.occupation_failures ?? 0, 'no crash window on a stream').to.equal(0);
      // No marker was written: the watermarks and checkpoints are all the dedup state.
      const markerKeys = await withRedis((redis) => redis.keys(`${space.prefix}mk:*`));
      expect(markerKeys).to.deep.equal([]);
    } finally {
      for (const d of daemons) if (d.child.exitCode === null && d.child.signalCode === null) await killDaemon(d);
      await cleanupStreams(space);
    }
  });

  it('two daemons reading every partition at once (the handover overlap, held open): exact', async () => {
    const space = streamSpace('stream-overlap', 2, { TALLY_FAULT_STREAM_OVERLAP: '1', TALLY_BATCH_SIZE: '20', TALLY_BATCH_WAIT_MS: '5' });
    const daemons: DaemonProcess[] = [];
    try {
      for (let i = 0; i < 2; i++) daemons.push(await startDaemon(space.env));
      for (const d of daemons) for (const p of [0, 1]) await d.waitForLog(`"partition":${p},"queue":"${space.streams[p]}"`);
      const workload = workloadFor(space, 3_000, 82, 0);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue, partitions: space.partitions });
      await caughtUp(space);
      for (const d of daemons) expect((await stopDaemon(d)).code).to.equal(0);
      const check = compare(await countsOf(space.prefix), workload.truth);
      expect(check.exact, `SKUs off their truth: ${check.below.length} below, ${check.excess.size} above`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.received, 'both daemons read everything').to.equal(2 * workload.publishes.length);
      // Every good message was applied once, by whichever daemon's batch came first on each shard.
      expect(stats.counted + (stats.replayed ?? 0)).to.equal(2 * workload.good);
      expect(stats.replayed, 'the overlap really happened').to.be.greaterThan(0);
    } finally {
      for (const d of daemons) if (d.child.exitCode === null && d.child.signalCode === null) await killDaemon(d);
      await cleanupStreams(space);
    }
  });

  it('12 SIGKILLs mid-stream, publishing going on: lost 0, over 0', async () => {
    const space = streamSpace('stream-kill', 2, { TALLY_BATCH_WAIT_MS: '10' });
    const workload = workloadFor(space, 6_000, 83, 0);
    const slices = 12;
    const per = Math.ceil(workload.publishes.length / slices);
    let killedAfterWrites = 0;
    try {
      for (let cycle = 0; cycle < slices; cycle++) {
        const daemon = spawnDaemon(space.env);
        await daemon.waitForLog('"msg":"consuming"');
        await publishAll(workload.publishes.slice(cycle * per, (cycle + 1) * per), { url: AMQP_URL, queue: space.queue, partitions: 2 });
        // Killed once it has applied something, 0 to 150 ms later: mid-batch, mid-checkpoint or between.
        const before = JSON.stringify([...(await checkpointsOf(space.prefix))]);
        const moved = await until(
          'the daemon to commit',
          async () => (JSON.stringify([...(await checkpointsOf(space.prefix))]) !== before ? true : undefined),
          20_000,
          20,
        ).catch(() => false);
        if (moved) killedAfterWrites++;
        await sleep(Math.floor(Math.random() * 150));
        await killDaemon(daemon);
      }
      const last = await startDaemon(space.env);
      await caughtUp(space);
      expect((await stopDaemon(last)).code).to.equal(0);
      const check = compare(await countsOf(space.prefix), workload.truth);
      expect(check.below, 'lost').to.deep.equal([]);
      expect(check.excess.size, 'counted twice').to.equal(0);
      expect(killedAfterWrites, 'kills that landed on a daemon at work').to.be.at.least(8);
    } finally {
      await cleanupStreams(space);
    }
  });

  it('a Redis back from an older snapshot (acknowledged writes lost, WAIT 0): the rollback is found and replayed from the log, exact', async () => {
    const redis = await startPrivateRedis();
    const space = streamSpace('stream-rollback', 2, { TALLY_REDIS_URL: redis.url, TALLY_ALLOW_EVICTION: 'false' });
    let daemon: DaemonProcess | null = null;
    try {
      daemon = await startDaemon(space.env);
      const workload = workloadFor(space, 3_000, 84, 0);
      const third = Math.floor(workload.publishes.length / 3);
      await publishAll(workload.publishes.slice(0, third), { url: AMQP_URL, queue: space.queue, partitions: 2 });
      await until('the first third checkpointed', async () => ((await checkpointsAt(redis.url, space.prefix)).size === 2 ? true : undefined), 60_000);
      // The snapshot Redis will come back from.
      const admin = redis.admin();
      await admin.save();
      admin.disconnect();
      await publishAll(workload.publishes.slice(third), { url: AMQP_URL, queue: space.queue, partitions: 2 });
      await until(
        'everything applied before the crash',
        async () => {
          const checkpoints = await checkpointsAt(redis.url, space.prefix);
          const bounds = await streamBounds(space.streams);
          return bounds.every((b, p) => b === null || (checkpoints.get(p) ?? -1) >= b.last) ? true : undefined;
        },
        60_000,
      );
      // Killed and restarted from the snapshot: two thirds of the writes it had acknowledged are gone.
      await redis.crashAndRestart(200);
      await daemon.waitForLog('a watermark went backwards', 30_000);
      await until(
        'the replay to restore every count',
        async () => (compare(await countsAt(redis.url, space.prefix), workload.truth).exact ? true : undefined),
        60_000,
      );
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const check = compare(await countsAt(redis.url, space.prefix), workload.truth);
      expect(check.below, 'lost').to.deep.equal([]);
      expect(check.excess.size, 'counted twice').to.equal(0);
      const stats = await withAdmin(redis.admin(), (client) => client.hgetall(`${space.prefix}stats`));
      expect(Number(stats.stream_rollbacks), 'rollbacks counted').to.be.at.least(1);
    } finally {
      if (daemon !== null && daemon.child.exitCode === null && daemon.child.signalCode === null) await killDaemon(daemon);
      await cleanupStreams(space);
      await redis.stop();
    }
  });

  it('retention deleted offsets past the checkpoint: the gap is counted and alerted, never skipped silently', async () => {
    const space = streamSpace('stream-retention', 1);
    const connection = await amqp.connect(AMQP_URL);
    try {
      // A stream that keeps little: small segments, a small total.
      const channel = await connection.createChannel();
      await channel.assertQueue(space.queue, {
        durable: true,
        arguments: { 'x-queue-type': 'stream', 'x-stream-max-segment-size-bytes': 20_000, 'x-max-length-bytes': 120_000 },
      });
      await channel.close();
      // Small enough to stay whole in what the stream keeps.
      const first = workloadFor(space, 100, 85, 0);
      let daemon = await startDaemon(space.env);
      await publishAll(first.publishes, { url: AMQP_URL, queue: space.queue });
      await caughtUp(space);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const checkpoint = (await checkpointsOf(space.prefix)).get(0)!.offset;
      // While no daemon reads, far more than the stream keeps is published: retention deletes the uncounted ones.
      const second = generateWorkload({ messages: 3_000, skus: 400, seed: 86, duplicateRate: 0, idPrefix: `${space.queue}.b`, maxChanges: 6, maxDelta: 9 });
      await publishAll(second.publishes, { url: AMQP_URL, queue: space.queue });
      // A probe that opens the stream while retention deletes its first segment gets nothing (one CI run): probe again.
      const bounds = await until('the stream to answer a probe of its bounds', async () => (await streamBounds(space.streams))[0] ?? undefined, 30_000, 500);
      expect(bounds.first, 'retention deleted offsets past the checkpoint').to.be.greaterThan(checkpoint + 1);
      daemon = await startDaemon(space.env);
      const line = await daemon.waitForLog('lost to counting');
      // Retention may delete a little more between this test's probe and the daemon's: the daemon's own figures are checked.
      const logged = JSON.parse(line) as { level: number; partition: number; checkpoint: number; firstLeft: number; lostOffsets: number };
      expect(logged).to.include({ level: 50, partition: 0, checkpoint });
      expect(logged.firstLeft).to.be.at.least(bounds.first);
      expect(logged.lostOffsets).to.equal(logged.firstLeft - checkpoint - 1);
      // Flushed within a second: the gap at the resume, and nothing lost while the first workload was read.
      await until('the gap counted', async () => ((await statsOf(space.prefix)).stream_gap_offsets > 0 ? true : undefined), 10_000);
      expect((await statsOf(space.prefix)).stream_gap_offsets).to.equal(logged.lostOffsets);
      await caughtUp(space);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const stats = await statsOf(space.prefix);
      expect(stats.stream_gap_offsets).to.equal(logged.lostOffsets);
      // What was left in the stream is counted: the counts are the first workload's plus some of the second's, never more.
      const counts = await countsOf(space.prefix);
      const both = new Map(first.truth);
      for (const [sku, n] of second.truth) both.set(sku, (both.get(sku) ?? 0) + n);
      expect(compare(counts, both).excess.size, 'nothing counted twice').to.equal(0);
      const firstCheck = compare(counts, first.truth);
      expect(
        firstCheck.below,
        `the first workload entirely: ${describeTruthCheck(firstCheck, counts, first.truth)}; stats ${JSON.stringify(stats)}`,
      ).to.deep.equal([]);
    } finally {
      await connection.close().catch(() => {});
      await cleanupStreams(space);
    }
  });

  it('a stream deleted and recreated under a live prefix: refused with the fix named; after tally stream reset, its new messages count', async () => {
    const space = streamSpace('stream-recreated', 1, { TALLY_METRICS_PORT: '0' });
    const connection = await amqp.connect(AMQP_URL);
    try {
      const first = workloadFor(space, 300, 87, 0);
      let daemon = await startDaemon(space.env);
      await publishAll(first.publishes, { url: AMQP_URL, queue: space.queue });
      await caughtUp(space);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const channel = await connection.createChannel();
      await channel.deleteQueue(space.queue);
      await channel.close();
      daemon = await startDaemon(space.env);
      // The daemon declared the stream again, empty: nothing to count, nothing to decide on yet.
      await daemon.waitForLog('the stream delivered nothing to a probe');
      const second = generateWorkload({ messages: 200, skus: 400, seed: 88, duplicateRate: 0, idPrefix: `${space.queue}.b`, maxChanges: 6, maxDelta: 9 });
      await publishAll(second.publishes, { url: AMQP_URL, queue: space.queue });
      // Now it ends before the checkpoint: recreated.
      const line = JSON.parse(await daemon.waitForLog('partition 0 refused')) as { msg: string; level: number };
      expect(line.level).to.equal(50);
      expect(line.msg).to.include('deleted and recreated').and.include('tally stream reset --partition 0');
      await sleep(1_500);
      expect(compare(await countsOf(space.prefix), first.truth).exact, 'nothing of the new stream counted while refused').to.equal(true);
      const reset = await tallyCli(space.env, 'stream', 'reset', '--partition', '0');
      expect(reset.code, reset.stderr).to.equal(0);
      await caughtUp(space);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const both = new Map(first.truth);
      for (const [sku, n] of second.truth) both.set(sku, (both.get(sku) ?? 0) + n);
      expect(compare(await countsOf(space.prefix), both).exact, 'the new stream counted from its start, once').to.equal(true);
    } finally {
      await connection.close().catch(() => {});
      await cleanupStreams(space);
    }
  });
});

async function checkpointsAt(url: string, prefix: string): Promise<Map<number, number>> {
  const { Redis } = await import('ioredis');
  const client = new Redis(url);
  try {
    const all = await client.hgetall(`${prefix}checkpoints`);
    return new Map(Object.entries(all).map(([p, raw]) => [Number(p), Number((JSON.parse(raw) as { offset: string }).offset)]));
  } finally {
    client.disconnect();
  }
}

async function withAdmin<T>(client: import('ioredis').Redis, run: (client: import('ioredis').Redis) => Promise<T>): Promise<T> {
  try {
    return await run(client);
  } finally {
    client.disconnect();
  }
}
