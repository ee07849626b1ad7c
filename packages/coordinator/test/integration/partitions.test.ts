/**
 * Partitioned queues (TALLY_PARTITIONS=8) consumed by several real daemons:
 * exact counts with true duplicates and bad messages, and a churn (a SIGKILL,
 * a daemon joining, one stopping cleanly) after which every partition has a
 * consumer again within the stated time and the partitions are balanced.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload, publishAll, type Workload } from '@tally/workload';
import { partitionQueues, type TallyMode } from '@tally/shared';
import { resetNamespace } from '@tally/testkit';
import { listDaemons, type LiveDaemon } from '../../src/fleet/heartbeat.js';
import {
  pinMarkerScope,
  compare,
  countsOf,
  killDaemon,
  runRefusedStart,
  startDaemon,
  statsOf,
  stopDaemon,
  testSpace,
  withRedis,
  AMQP_URL,
  REDIS_URL,
  type DaemonProcess,
  type TestSpace,
} from './harness.js';
import { tallyCli, until } from './fleet-helpers.js';
import { metricsText, sample } from './runtime-probes.js';
import type { StatusReport } from '../../src/commands/status.js';
import { largestBatchUnits, partsById } from './crash-window.js';

const PARTITIONS = 8;
const HEARTBEAT_MS = 500;
const BATCH_SIZE = 100;
const VSHARDS = 16;
/** The stated handoff time: a dead daemon's key expires after 3 beats, the others move at their next one. */
const HANDOFF_LIMIT_MS = 4 * HEARTBEAT_MS + 2_000;

function partitionedSpace(label: string, mode: TallyMode): TestSpace {
  return testSpace(label, {
    TALLY_MODE: mode,
    TALLY_PARTITIONS: String(PARTITIONS),
    TALLY_HEARTBEAT_MS: String(HEARTBEAT_MS),
    TALLY_WORKERS: '1',
    TALLY_BATCH_SIZE: String(BATCH_SIZE),
    TALLY_PREFETCH: '200',
  });
}

async function queueDepths(queue: string): Promise<Array<{ messageCount: number; consumerCount: number }>> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const channel = await connection.createChannel();
    const out = [];
    for (const name of partitionQueues(queue, PARTITIONS)) out.push(await channel.checkQueue(name));
    return out;
  } finally {
    await connection.close().catch(() => {});
  }
}

async function liveDaemons(prefix: string): Promise<LiveDaemon[]> {
  return withRedis((redis) => listDaemons([redis], prefix));
}

/** Every partition held by exactly one live, not-leaving daemon, and every queue with a consumer. */
async function everyPartitionHeld(space: TestSpace, daemons: number): Promise<LiveDaemon[] | undefined> {
  const live = (await liveDaemons(space.prefix)).filter((d) => !d.leaving && d.consuming);
  if (live.length !== daemons) return undefined;
  const held = live.flatMap((d) => d.partitions).sort((a, b) => a - b);
  if (held.join(',') !== Array.from({ length: PARTITIONS }, (_, p) => p).join(',')) return undefined;
  const depths = await queueDepths(space.queue);
  return depths.every((q) => q.consumerCount >= 1) ? live : undefined;
}

async function drained(space: TestSpace): Promise<void> {
  await until('every partition drained', async () => ((await queueDepths(space.queue)).every((q) => q.messageCount === 0) ? true : undefined), 120_000);
}

function workloadFor(space: TestSpace, messages: number, seed: number): Workload {
  return generateWorkload({ messages, skus: 400, seed, duplicateRate: 0.03, badRate: 0.01, idPrefix: space.queue, maxChanges: 6, maxDelta: 9 });
}

describe('partitioned queues (integration)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(300_000);

  for (const mode of ['atomic', 'two-step'] as TallyMode[]) {
    it(`${mode}: 8 partitions, 3 daemons, duplicates and bad messages: exact, balanced, each id on one partition`, async () => {
      const space = partitionedSpace(`part-exact-${mode}`, mode);
      const daemons: DaemonProcess[] = [];
      const started = performance.now();
      try {
        daemons.push(await startDaemon({ ...space.env, TALLY_METRICS_PORT: '0' }));
        for (let i = 1; i < 3; i++) daemons.push(await startDaemon(space.env));
        const live = await until('8 partitions over 3 daemons', () => everyPartitionHeld(space, 3), 30_000);
        for (const d of live) expect(d.partitions.length, d.id).to.be.within(2, 3);
        // tally status: each partition, its depth, its one holder.
        const status = JSON.parse((await tallyCli(space.env, 'status', '--json')).stdout) as StatusReport;
        expect(status.partitions.map((p) => p.queue)).to.deep.equal(partitionQueues(space.queue, PARTITIONS));
        for (const p of status.partitions) {
          expect(p.held_by, `partition ${p.partition}`).to.have.length(1);
          expect(p.depth).to.equal(0);
          expect(p.consumers).to.be.at.least(1);
        }
        expect(status.layout?.partitions).to.equal(PARTITIONS);
        // /metrics: the first daemon's partitions, one labelled series each.
        const port = Number((JSON.parse(await daemons[0]!.waitForLog('http endpoint listening')) as { port: number }).port);
        const first = live.find((d) => d.pid === daemons[0]!.child.pid)!;
        const text = await metricsText(port);
        expect(sample(text, 'tally_partitions_held')).to.equal(first.partitions.length);
        expect(sample(text, 'tally_partitions_configured')).to.equal(PARTITIONS);
        for (const p of first.partitions) {
          expect(sample(text, 'tally_partition_held', { partition: String(p) }), `partition ${p}`).to.equal(1);
          expect(sample(text, 'tally_deliveries_in_flight', { partition: String(p) })).to.equal(0);
          expect(sample(text, 'tally_oldest_unacked_age_seconds', { partition: String(p) })).to.equal(0);
        }
        const workload = workloadFor(space, 3_000, 71);
        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
        await drained(space);
        await until('every delivery acked', async () => ((await liveDaemons(space.prefix)).every((d) => d.in_flight === 0) ? true : undefined), 30_000);
        for (const d of daemons) expect((await stopDaemon(d)).code).to.equal(0);
        const check = compare(workload.truth, await countsOf(space.prefix, VSHARDS));
        expect(check.exact, `SKUs off their truth: ${check.below.length} below, ${check.excess.size} above`).to.equal(true);
        const stats = await statsOf(space.prefix);
        expect(stats.dead_lettered).to.equal(workload.bad);
        expect(stats.received).to.equal(workload.publishes.length);
        expect((stats.duplicates ?? 0) + (stats.partial_duplicates ?? 0)).to.equal(workload.duplicates);
        // Consistent hashing spread the ids: every partition got some.
        const consumedPerDaemon = daemons.map((d) => d.logs.filter((l) => l.includes('partition subscribed')).length);
        expect(consumedPerDaemon.reduce((a, b) => a + b, 0)).to.be.at.least(PARTITIONS);
        console.log(`      ${mode} exact: ${workload.publishes.length} messages, ${((performance.now() - started) / 1000).toFixed(1)} s`);
      } finally {
        for (const d of daemons) if (d.child.exitCode === null && d.child.signalCode === null) await killDaemon(d);
        await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: PARTITIONS });
      }
    });
  }

  it('quorum partition queues: exact over 2 daemons, and a clean stop hands its partitions to the other (quorum SAC activates at the cancel)', async () => {
    const space = partitionedSpace('part-quorum', 'two-step');
    const env = { ...space.env, TALLY_QUEUE_TYPE: 'quorum' };
    const daemons: DaemonProcess[] = [];
    try {
      for (let i = 0; i < 2; i++) daemons.push(await startDaemon(env));
      await until('8 quorum partitions over 2 daemons', () => everyPartitionHeld(space, 2), 30_000);
      const workload = workloadFor(space, 2_000, 97);
      const half = workload.publishes.length / 2;
      await publishAll(workload.publishes.slice(0, half), { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
      const stopping = stopDaemon(daemons[0]!);
      await publishAll(workload.publishes.slice(half), { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
      expect((await stopping).code).to.equal(0);
      const [alone] = await until('one daemon holds all 8', () => everyPartitionHeld(space, 1), 15_000);
      expect(alone!.partitions).to.have.length(PARTITIONS);
      await drained(space);
      await until('every delivery acked', async () => ((await liveDaemons(space.prefix)).every((d) => d.in_flight === 0) ? true : undefined), 30_000);
      expect((await stopDaemon(daemons[1]!)).code).to.equal(0);
      const check = compare(workload.truth, await countsOf(space.prefix, VSHARDS));
      expect(check.exact, `${check.below.length} below, ${check.excess.size} above`).to.equal(true);
      expect((await statsOf(space.prefix)).dead_lettered).to.equal(workload.bad);
    } finally {
      for (const d of daemons) if (d.child.exitCode === null && d.child.signalCode === null) await killDaemon(d);
      await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: PARTITIONS });
    }
  });

  it('refuses a TALLY_PARTITIONS other than the one recorded for the prefix, with one line naming it', async () => {
    const space = partitionedSpace('part-refuse', 'atomic');
    try {
      const daemon = await startDaemon(space.env);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const refused = await runRefusedStart({ ...space.env, TALLY_PARTITIONS: '4' });
      expect(refused.code).to.not.equal(0);
      expect(refused.fatalCode).to.equal('TALLY_PARTITIONS_MISMATCH');
      expect(refused.stderrLines).to.have.length(1);
      expect(refused.stderrLines[0]).to.include('TALLY_PARTITIONS=4').and.include('8 partitions');
    } finally {
      await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: PARTITIONS });
    }
  });

  for (const mode of ['atomic', 'two-step'] as TallyMode[]) {
    it(`${mode}: SIGKILL one of 3, start a 4th, stop one cleanly: every partition consumed again in time, ${mode === 'atomic' ? 'exact' : 'lost 0, overcount within one batch per shard'}, balanced`, async () => {
      const space = partitionedSpace(`part-churn-${mode}`, mode);
      const daemons: DaemonProcess[] = [];
      const started = performance.now();
      try {
        for (let i = 0; i < 3; i++) daemons.push(await startDaemon(space.env));
        await until('8 partitions over 3 daemons', () => everyPartitionHeld(space, 3), 30_000);
        const workload = workloadFor(space, 4_000, 83);
        // Published in four slices around the three events, so each one happens with deliveries in flight.
        const slices = [0, 1, 2, 3].map((i) => workload.publishes.slice((i * workload.publishes.length) / 4, ((i + 1) * workload.publishes.length) / 4));
        await publishAll(slices[0]!, { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
        await sleep(300);

        const handoffs: Record<string, number> = {};
        const timeHandoff = async (what: string, daemonsAfter: number) => {
          const at = performance.now();
          await until(`${what}: every partition consumed again`, () => everyPartitionHeld(space, daemonsAfter), 30_000, 100);
          handoffs[what] = Math.round(performance.now() - at);
        };

        await killDaemon(daemons[0]!);
        const publishing = publishAll(slices[1]!, { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
        await timeHandoff('sigkill', 2);
        await publishing;

        daemons.push(await startDaemon(space.env));
        await publishAll(slices[2]!, { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
        await timeHandoff('join', 3);

        const stopping = stopDaemon(daemons[1]!);
        await publishAll(slices[3]!, { url: AMQP_URL, queue: space.queue, partitions: PARTITIONS });
        expect((await stopping).code).to.equal(0);
        await timeHandoff('clean stop', 2);

        for (const [what, ms] of Object.entries(handoffs)) expect(ms, `${what} handoff ms`).to.be.below(HANDOFF_LIMIT_MS);
        const live = await until('balanced', () => everyPartitionHeld(space, 2), 10_000);
        for (const d of live) expect(d.partitions.length, `${d.id} holds more than ⌈8/2⌉`).to.be.at.most(Math.ceil(PARTITIONS / 2));

        await drained(space);
        await until('every delivery acked', async () => ((await liveDaemons(space.prefix)).every((d) => d.in_flight === 0) ? true : undefined), 30_000);
        for (const d of daemons.slice(2)) expect((await stopDaemon(d)).code).to.equal(0);

        const check = compare(workload.truth, await countsOf(space.prefix, VSHARDS));
        expect(check.missingUnits, 'lost (no loss in either mode)').to.equal(0);
        if (mode === 'atomic') expect(check.exact, `atomic: exact (${check.excessUnits} over)`).to.equal(true);
        else {
          const parts = partsById(workload.publishes, VSHARDS);
          const bound = Array.from({ length: VSHARDS }, (_, v) => largestBatchUnits(parts, v, BATCH_SIZE)).reduce((a, b) => a + b, 0);
          expect(check.excessUnits, 'two-step overcount: one SIGKILL, at most one batch per shard').to.be.at.most(bound);
          console.log(`      two-step overcount ${check.excessUnits} units (bound ${bound})`);
        }
        const stats = await statsOf(space.prefix);
        expect(stats.dead_lettered).to.be.at.least(workload.bad);
        console.log(`      ${mode} churn: handoffs ${JSON.stringify(handoffs)} ms, ${((performance.now() - started) / 1000).toFixed(1)} s`);
      } finally {
        for (const d of daemons) if (d.child.exitCode === null && d.child.signalCode === null) await killDaemon(d);
        await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: PARTITIONS });
      }
    });
  }
  it('dead replay sends each dead letter back to the partition it came from', async () => {
    const space = partitionedSpace('part-replay', 'atomic');
    try {
      await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: PARTITIONS });
      const daemon = await startDaemon(space.env);
      // Bad bodies with ids: the exchange routes each by its id; the daemon dead-letters it from that partition.
      const connection = await amqp.connect(AMQP_URL);
      const channel = await connection.createConfirmChannel();
      const ids = ['bad-a', 'bad-b', 'bad-c', 'bad-d', 'bad-e', 'bad-f'];
      for (const id of ids)
        channel.publish(space.queue, id, Buffer.from('{"id": "' + id + '", "changes": "not an array"}'), { messageId: id, persistent: true });
      await channel.waitForConfirms();
      await connection.close();
      await until('all dead-lettered', async () => ((await statsOf(space.prefix)).dead_lettered === ids.length ? true : undefined), 30_000);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const sources = await withDeadLetters(space.queue, (messages) => messages.map((m) => String(m.properties.headers?.['x-tally-source-queue'])));
      expect(new Set(sources).size, 'the ids spread over several partitions').to.be.greaterThan(1);
      const replay = await tallyCli(space.env, 'dead', 'replay', '--json');
      expect(replay.code, replay.stderr).to.equal(0);
      const depths = await queueDepths(space.queue);
      const expected = new Map<string, number>();
      for (const source of sources) expected.set(source, (expected.get(source) ?? 0) + 1);
      partitionQueues(space.queue, PARTITIONS).forEach((name, p) => expect(depths[p]!.messageCount, name).to.equal(expected.get(name) ?? 0));
    } finally {
      await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: PARTITIONS });
    }
  });
});

/** The dead letters of `<queue>.dead`, read and put back in order. */
async function withDeadLetters<T>(queue: string, read: (messages: amqp.GetMessage[]) => T): Promise<T> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const channel = await connection.createChannel();
    const messages: amqp.GetMessage[] = [];
    for (;;) {
      const message = await channel.get(`${queue}.dead`, { noAck: false });
      if (message === false) break;
      messages.push(message);
    }
    const result = read(messages);
    channel.nackAll(true);
    await channel.close();
    return result;
  } finally {
    await connection.close().catch(() => {});
  }
}
