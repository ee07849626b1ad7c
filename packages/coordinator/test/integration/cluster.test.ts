/**
 * Tally on a real Redis Cluster (3 masters, 3 replicas, started by testkit):
 * the daemon detects it, writes every shard batch to its slot's master, and
 * the CLI reads every master. The kill and failover scenarios are in the
 * fault suite (test-faults/10-cluster.fault.ts).
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { Redis } from 'ioredis';
import { generateWorkload, publishAll } from '@tally/workload';
import { resetNamespace, startRedisCluster, type RedisCluster } from '@tally/testkit';
import { keySlot, isCluster, scanNodes } from '@tally/runtime';
import {
  countKey,
  layoutKey,
  markerDigest,
  markerShardOf,
  MESSAGE_MARKER_FORMAT,
  FENCED_MESSAGE_MARKER_FORMAT,
  shardOf,
  STANDING_COUNTS_HEADER,
  standingKey,
  type TallyMode,
} from '@tally/shared';
import { EXIT_REPLAY_REFUSED } from '../../src/commands/dead.js';
import type { StatusReport } from '../../src/commands/status.js';
import { readWatermarks } from '../../src/stream/watermark-audit.js';
import {
  cleanup,
  compare,
  runRefusedStart,
  startDaemon,
  stopDaemon,
  testSpace,
  waitForReadyBelow,
  waitForReadyEmpty,
  AMQP_URL,
  REDIS_URL,
  type DaemonProcess,
} from './harness.js';
import { tallyCli, until } from './fleet-helpers.js';
import { countKeysPerMaster, withRedisAt } from './cluster-helpers.js';

/** Every SKU's count as `tally counts --json` reads it from the cluster. */
async function cliCounts(env: Record<string, string>): Promise<Map<string, number>> {
  return new Map(Object.entries(JSON.parse((await tallyCli(env, 'counts', '--json')).stdout) as Record<string, number>));
}

/**
 * Waits until the counts are the truth: a stream has no queue whose drain
 * says the work is done. A stall names its cause in the daemons' warnings,
 * shown with the failure.
 */
async function untilCountsAreTheTruth(env: Record<string, string>, truth: ReadonlyMap<string, number>, daemons: readonly DaemonProcess[]): Promise<void> {
  let last = '';
  await until(
    'the counts to reach the truth',
    async () => {
      const diff = compare(await cliCounts(env), truth);
      last = `lost ${diff.missingUnits}, excess ${diff.excessUnits}`;
      return diff.exact ? true : undefined;
    },
    120_000,
    300,
  ).catch((error: unknown) => {
    const warnings = daemons.flatMap((daemon) => daemon.logs.filter((line) => !line.includes('"level":30')).slice(-10));
    throw new Error(`${String(error)} (${last}); daemon warnings:\n${warnings.join('\n')}`);
  });
}

/** Whether `slot` is in one of a master's CLUSTER NODES slot ranges (`5461` or `0-5460`). */
function slotIn(slot: number, range: string): boolean {
  const [from, to = from] = range.split('-').map(Number);
  return slot >= from! && slot <= to!;
}

describe('Redis Cluster (integration: 3 masters + 3 replicas of our own)', function () {
  this.timeout(300_000);
  let cluster: RedisCluster;
  /** Two of the six nodes as seeds: the client finds the rest from them. */
  let seeds: string;

  before(async () => {
    cluster = await startRedisCluster();
    seeds = `${cluster.seedUrls[0]},${cluster.seedUrls[4]}`;
  });

  after(async () => {
    await cluster?.stop();
  });

  it("computes every key's slot as the cluster does (hash tags included)", async () => {
    const keys = ['foo', '{7}', 'tally:c:{7}:sku-1', 'tally:m:{7}:id', 'x{}y', '{}{7}', 'a{b}c{d}', 'é{ü}', 't.fleet:daemon:host:123:abcd', 'tally:stats'];
    await withRedisAt(seeds, async (redis) => {
      expect(isCluster(redis)).to.equal(true);
      const node = scanNodes(redis)[0]!;
      for (const key of keys) expect(keySlot(key), key).to.equal(Number(await node.cluster('KEYSLOT', key)));
    });
  });

  it('a stream refuses message-scoped markers at start, before the prefix is laid out: its batch is one script, and a message spans hash slots', async () => {
    const space = testSpace('cluster-scope', { TALLY_REDIS_URL: seeds, TALLY_SOURCE: 'stream', TALLY_MARKER_SCOPE: 'message' });
    try {
      const refused = await runRefusedStart(space.env);
      expect(refused.code).to.equal(1);
      expect(refused.fatalCode).to.equal('TALLY_MARKER_FORMAT');
      expect(refused.stderrLines, 'one line').to.have.length(1);
      expect(refused.stderrLines[0]).to.include('TALLY_SOURCE=stream').and.include('TALLY_MARKER_SCOPE=part');
      const laidOut = await withRedisAt(seeds, (redis) => redis.exists(layoutKey(space.prefix)));
      expect(laidOut, 'no layout recorded with a scope the cluster cannot serve').to.equal(0);
    } finally {
      await cleanup(space);
    }
  });

  it('a prefix laid out message-scoped by two-step mode refuses an atomic daemon at start', async () => {
    const space = testSpace('cluster-scope-mix', { TALLY_REDIS_URL: seeds, TALLY_MODE: 'two-step' });
    try {
      await stopDaemon(await startDaemon(space.env));
      const format = await withRedisAt(seeds, (redis) => redis.hget(layoutKey(space.prefix), 'marker_format'));
      expect(format, 'two-step on a cluster lays a new prefix out message-scoped').to.equal(MESSAGE_MARKER_FORMAT);
      const refused = await runRefusedStart({ ...space.env, TALLY_MODE: 'atomic' });
      expect(refused.fatalCode).to.equal('TALLY_MARKER_FORMAT');
      expect(refused.stderrLines[0]).to.include(space.prefix).and.include(FENCED_MESSAGE_MARKER_FORMAT);
    } finally {
      await cleanup(space);
    }
  });

  it('two-step, message-scoped: counts per slot, one marker per message; a message refused on one slot counts nothing on the others, and its replay counts it once', async () => {
    const virtualShards = 16;
    const space = testSpace('cluster-refused', { TALLY_REDIS_URL: seeds, TALLY_MODE: 'two-step', TALLY_BATCH_WAIT_MS: '10' });
    try {
      const workload = generateWorkload({ messages: 800, skus: 80, seed: 34, duplicateRate: 0.05, badRate: 0, idInPropertyShare: 0, idPrefix: space.queue });
      const poisoned = 'SKU-000007';
      const poisonKey = countKey(space.prefix, shardOf(poisoned, virtualShards), poisoned);
      await withRedisAt(seeds, (redis) => redis.set(poisonKey, 'abc'));
      const bodies = new Map<string, Array<{ sku: string; delta: number }>>();
      for (const p of workload.publishes) {
        const body = JSON.parse(p.body.toString()) as { id: string; changes: Array<{ sku: string; delta: number }> };
        bodies.set(body.id, body.changes);
      }
      const refused = [...bodies].filter(([, changes]) => changes.some((c) => c.sku === poisoned && c.delta !== 0));
      const spanning = refused.filter(
        ([, changes]) => new Set(changes.map((c) => keySlot(countKey(space.prefix, shardOf(c.sku, virtualShards), c.sku)))).size > 1,
      );
      expect(spanning.length, 'refused messages whose counts span slots').to.be.greaterThan(5);
      // Message scope: a refused message counts nothing at all, on any slot.
      const before = new Map(workload.truth);
      for (const [, changes] of refused) for (const { sku, delta } of changes) before.set(sku, (before.get(sku) ?? 0) - delta);
      for (const [sku, n] of before) if (n === 0) before.delete(sku);

      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const daemon = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      await sleep(500);
      expect((await stopDaemon(daemon)).code).to.equal(0);

      const readCounts = async (): Promise<Map<string, number>> => {
        const out = await tallyCli(space.env, 'counts', '--json');
        const counts = new Map(Object.entries(JSON.parse(out.stdout) as Record<string, number>));
        counts.delete(poisoned);
        return counts;
      };
      const first = compare(await readCounts(), before);
      expect(first.below, 'nothing else lost').to.deep.equal([]);
      expect([...first.excess], 'no part of a refused message counted on another slot').to.deep.equal([]);
      const stats = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as Record<string, number>;
      expect(stats.dead_lettered).to.equal(refused.length);

      await withRedisAt(seeds, async (redis) => {
        const keys = (await Promise.all(scanNodes(redis).map((node) => node.keys(`${space.prefix}mk:*`)))).flat();
        const shardsWithMarkers = new Set(keys.map((k) => Number(/\{(\d+)\}/.exec(k)![1])));
        expect(
          [...shardsWithMarkers].every((shard) => shard < 4),
          `markers on the 4 marker shards only: ${[...shardsWithMarkers].join(',')}`,
        ).to.equal(true);
        await redis.del(poisonKey);
      });
      const replay = await tallyCli(space.env, 'dead', 'replay', '--reason', 'count-refused', '--json');
      expect(replay.code, replay.stderr).to.equal(0);
      const again = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      await sleep(500);
      expect((await stopDaemon(again)).code).to.equal(0);
      const final = compare(await readCounts(), new Map([...workload.truth].filter(([sku]) => sku !== poisoned)));
      expect(final.exact, `after the replay: lost ${final.missingUnits}, excess ${final.excessUnits}`).to.equal(true);
    } finally {
      await cleanup(space);
    }
  });

  it('two-step, message-scoped: an undo Redis refuses leaves that count standing, counted in undo_failures, and its dead letter kept back from a replay until forced', async () => {
    const virtualShards = 16;
    const space = testSpace('cluster-undo', { TALLY_REDIS_URL: seeds, TALLY_MODE: 'two-step', TALLY_BATCH_WAIT_MS: '10' });
    const masterOf = slotMasters(await withRedisAt(seeds, (redis) => scanNodes(redis)[0]!.cluster('SLOTS')));
    const shardMaster = (shard: number): number => masterOf(keySlot(`{${shard}}`));
    // The refused SKU's shard on one master (B), the SKU whose undo is refused on another (A), and the message's marker shard off B.
    const skus = Array.from({ length: 400 }, (_, i) => `SKU-U${i}`);
    const refusedSku = skus[0]!;
    const paused = shardMaster(shardOf(refusedSku, virtualShards));
    const [changingSku, undoneSku] = skus.filter((sku) => shardMaster(shardOf(sku, virtualShards)) !== paused);
    const id = Array.from({ length: 100 }, (_, i) => `${space.queue}-m${i}`).find(
      (candidate) => shardMaster(markerShardOf(markerDigest(candidate), virtualShards)) !== paused,
    )!;
    const refusedKey = countKey(space.prefix, shardOf(refusedSku, virtualShards), refusedSku);
    const changingKey = countKey(space.prefix, shardOf(changingSku!, virtualShards), changingSku!);
    const undoneKey = countKey(space.prefix, shardOf(undoneSku!, virtualShards), undoneSku!);
    const changingMaster = `redis://127.0.0.1:${shardMaster(shardOf(changingSku!, virtualShards))}`;
    const body = {
      id,
      changes: [
        { sku: refusedSku, delta: 3 },
        { sku: changingSku!, delta: 5 },
        { sku: undoneSku!, delta: 7 },
      ],
    };

    // The race a real fleet loses rarely, made certain: the refused key's master holds writes back, while a hand on the
    // other master changes the key the moment the message's increment lands there, before the undo comes.
    const watcher = new Redis(changingMaster);
    const hand = new Redis(changingMaster);
    const holder = new Redis(`redis://127.0.0.1:${paused}`);
    let daemon: DaemonProcess | null = null;
    try {
      await withRedisAt(seeds, (redis) => redis.set(refusedKey, 'abc'));
      await hand.config('SET', 'notify-keyspace-events', 'K$');
      let changed = false;
      // The refused key's master holds writes until the hand has changed the key (30 s at most: a loaded machine may be slow
      // to get the write there), so the refusal, and the undo after it, come only then.
      watcher.on('message', (_channel: string, event: string) => {
        if (event !== 'incrby' || changed) return;
        changed = true;
        void hand.set(changingKey, 'changed by hand').finally(() => holder.call('CLIENT', 'UNPAUSE'));
      });
      await watcher.subscribe(`__keyspace@0__:${changingKey}`);
      daemon = await startDaemon(space.env);
      await holder.call('CLIENT', 'PAUSE', '30000', 'WRITE');
      // A producer's own standing-counts header is no one's word: the dead letter must carry the daemon's alone.
      const forged = { [STANDING_COUNTS_HEADER]: JSON.stringify({ [undoneKey]: '9' }) };
      await publishAll([{ kind: 'good', body: Buffer.from(JSON.stringify(body)), id, headers: forged }], { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      const stats = await until('the dead letter', async () => {
        const read = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as Record<string, number>;
        return read.dead_lettered === 1 ? read : undefined;
      });
      expect(changed, 'the hand changed the key after the write').to.equal(true);
      expect(stats.undo_failures, 'the refused part whose counts stand, counted once').to.equal(1);
      expect(stats.count_errors).to.equal(1);
      const line = daemon.logs.find((l) => l.includes('could not undo the counts of a refused message'));
      expect(line, 'one error line naming what stands').to.not.equal(undefined);
      expect(JSON.parse(line!).stand).to.deep.equal({ [changingKey]: '5' });
      await withRedisAt(seeds, async (redis) => {
        expect(Number((await redis.get(undoneKey)) ?? 0), 'the other key is taken back').to.equal(0);
        expect(await redis.get(changingKey)).to.equal('changed by hand');
      });

      const listed = JSON.parse((await tallyCli(space.env, 'dead', 'list', '--json')).stdout) as { messages: Array<{ id: string; standing?: unknown }> };
      expect(
        listed.messages.map((m) => [m.id, m.standing]),
        'the dead letter names the count that stands',
      ).to.deep.equal([[id, { [changingKey]: '5' }]]);
      // Seconds old, well within the marker lifetime, and still kept back: no marker stops a second count of what stands.
      const kept = await tallyCli(space.env, 'dead', 'replay', '--reason', 'count-refused');
      expect(kept.code, kept.stderr).to.equal(EXIT_REPLAY_REFUSED);
      expect(kept.stderr).to.include('counts that stand').and.include(`INCRBY ${changingKey} -5`).and.include('--force');
      // A dead letter can lose the header (the message came back before its dead copy was confirmed, and was refused again
      // with nothing left to undo): Redis's record by the message's digest keeps it back all the same.
      await stripStandingHeader(`${space.queue}.dead`);
      const relisted = JSON.parse((await tallyCli(space.env, 'dead', 'list', '--json')).stdout) as {
        messages: Array<{ id: string; standing?: unknown; standingSource?: string }>;
      };
      expect(
        relisted.messages.map((m) => [m.id, m.standing, m.standingSource]),
        'the list shows what Redis records when the header is gone',
      ).to.deep.equal([[id, { [changingKey]: '5' }, 'redis']]);
      const bare = await tallyCli(space.env, 'dead', 'replay', '--reason', 'count-refused');
      expect(bare.code, bare.stderr).to.equal(EXIT_REPLAY_REFUSED);
      expect(bare.stderr).to.include(`INCRBY ${changingKey} -5`);
      const record = standingKey(space.prefix, markerDigest(id).toString('hex'));
      expect(await withRedisAt(seeds, (redis) => redis.hgetall(record))).to.deep.equal({ [changingKey]: '5' });

      // The operator repairs the keys: the foreign values go, and the standing 5 is subtracted from what it became.
      await withRedisAt(seeds, async (redis) => {
        await redis.del(refusedKey);
        await redis.set(changingKey, '5');
        await redis.incrby(changingKey, -5);
      });
      const forced = await tallyCli(space.env, 'dead', 'replay', '--reason', 'count-refused', '--force');
      expect(forced.code, forced.stderr).to.equal(0);
      expect(forced.stderr).to.include('FORCED').and.include(`INCRBY ${changingKey} -5`);
      await waitForReadyEmpty(space.queue);
      const counts = await until('the replay counted', async () => {
        const read = JSON.parse((await tallyCli(space.env, 'counts', '--json')).stdout) as Record<string, number>;
        return read[refusedSku] === 3 ? read : undefined;
      });
      expect(counts, 'counted once after the repair').to.deep.include({ [refusedSku]: 3, [changingSku!]: 5, [undoneSku!]: 7 });
      const after = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as Record<string, number>;
      expect(after.forced_replays).to.equal(1);
      expect(after.undo_failures, 'the replay undid nothing').to.equal(1);
      expect(await withRedisAt(seeds, (redis) => redis.exists(record)), 'the forced replay drops the record: what stood was subtracted').to.equal(0);
    } finally {
      await holder.call('CLIENT', 'UNPAUSE').catch(() => {});
      await hand.config('SET', 'notify-keyspace-events', '').catch(() => {});
      watcher.disconnect();
      hand.disconnect();
      holder.disconnect();
      if (daemon !== null) await stopDaemon(daemon);
      await cleanup(space);
    }
  });

  it('two-step, message-scoped: a thread that dies after writing counts on several slots, before the marker, counts nothing twice (receipts per slot)', async () => {
    const space = testSpace('cluster-receipts', {
      TALLY_REDIS_URL: seeds,
      TALLY_MODE: 'two-step',
      TALLY_WORKERS: '2',
      TALLY_BATCH_SIZE: '100',
      // Each thread (each replacement too) dies after its 4th count write: a loaded machine drains 3,000
      // messages in fewer, fuller batches, and with 10 one CI run saw no thread reach it.
      TALLY_FAULT_THREAD_EXIT_AFTER_WRITE: '4',
    });
    let daemon: DaemonProcess | null = null;
    try {
      const workload = generateWorkload({ messages: 3_000, skus: 400, seed: 35, duplicateRate: 0.02, badRate: 0, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      daemon = await startDaemon(space.env);
      await waitForReadyEmpty(space.queue);
      await sleep(1_000);
      const deaths = daemon.logs.filter((l) => l.includes('fault injection: worker thread exits')).length;
      const reruns = daemon.logs.filter((l) => l.includes('batch failed in its worker thread')).length;
      expect((await stopDaemon(daemon)).code).to.equal(0);
      daemon = null;
      expect(deaths, 'threads died between their count writes and their markers').to.be.greaterThan(0);
      expect(reruns, 'and their batches were rerun').to.be.greaterThan(0);
      const counts = await cliCounts(space.env);
      const diff = compare(counts, workload.truth);
      expect(diff.exact, `the reruns found every slot's receipt: lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
    } finally {
      if (daemon !== null) await stopDaemon(daemon);
      await cleanup(space);
    }
  });

  it('partitioned queues on the cluster: 4 partitions, 2 daemons, both modes exact', async () => {
    for (const mode of ['atomic', 'two-step'] as TallyMode[]) {
      const space = testSpace(`cluster-part-${mode}`, { TALLY_REDIS_URL: seeds, TALLY_MODE: mode, TALLY_PARTITIONS: '4', TALLY_BATCH_SIZE: '100' });
      const daemons: DaemonProcess[] = [];
      try {
        const workload = generateWorkload({
          messages: 2_000,
          skus: 300,
          seed: mode === 'atomic' ? 61 : 62,
          duplicateRate: 0.05,
          badRate: 0.02,
          idPrefix: space.queue,
        });
        daemons.push(await startDaemon(space.env), await startDaemon(space.env));
        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue, partitions: 4 });
        await until(
          'every partition drained',
          async () => {
            const stats = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as {
              received: number;
              counted: number;
              duplicates: number;
              partial_duplicates: number;
              dead_lettered: number;
            };
            return stats.received >= workload.publishes.length &&
              stats.counted + stats.duplicates + stats.partial_duplicates + stats.dead_lettered >= workload.publishes.length
              ? true
              : undefined;
          },
          60_000,
          300,
        );
        for (const daemon of daemons.splice(0)) expect((await stopDaemon(daemon)).code).to.equal(0);
        const counts = await cliCounts(space.env);
        const diff = compare(counts, workload.truth);
        expect(diff.exact, `${mode}: lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
        // TALLY_MARKER_SCOPE unset: on a cluster, both modes lay a new prefix out message-scoped, atomic with fenced adoption.
        const format = await withRedisAt(seeds, (redis) => redis.hget(layoutKey(space.prefix), 'marker_format'));
        expect(format, 'the default scope on a cluster').to.equal(mode === 'atomic' ? FENCED_MESSAGE_MARKER_FORMAT : MESSAGE_MARKER_FORMAT);
        const status = (await tallyCli(space.env, 'status')).stdout;
        expect(status, 'tally status names the layout').to.include('message-scoped markers');
        expect(status.includes('(fenced adoption)'), 'and says whether it has fenced adoption').to.equal(mode === 'atomic');
      } finally {
        for (const daemon of daemons) await stopDaemon(daemon);
        await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: 4 });
      }
    }
  });

  it("streams on the cluster: 4 stream partitions, 2 daemons, exact; each shard's watermarks in its counts' slot, no marker", async () => {
    const space = testSpace('cluster-stream', {
      TALLY_REDIS_URL: seeds,
      TALLY_SOURCE: 'stream',
      TALLY_PARTITIONS: '4',
      TALLY_HEARTBEAT_MS: '500',
      TALLY_STREAM_CHECKPOINT_MS: '200',
      TALLY_BATCH_SIZE: '100',
      TALLY_PREFETCH: '400',
    });
    const daemons: DaemonProcess[] = [];
    try {
      const workload = generateWorkload({ messages: 2_000, skus: 300, seed: 63, duplicateRate: 0.05, badRate: 0.02, idPrefix: space.queue });
      daemons.push(await startDaemon(space.env), await startDaemon(space.env));
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue, partitions: 4 });
      // Done when the counts are the truth. Not when the counters add up: while the second daemon takes its
      // partitions over, both read them, and a message whose parts the two applied between them is
      // counted by neither counter as a whole (it is `replayed` on one, partly, and counted on the other).
      await untilCountsAreTheTruth(space.env, workload.truth, daemons);
      for (const daemon of daemons.splice(0)) expect((await stopDaemon(daemon)).code).to.equal(0);
      const counts = await cliCounts(space.env);
      const diff = compare(counts, workload.truth);
      expect(diff.exact, `lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
      await withRedisAt(seeds, async (redis) => {
        const keys = (await Promise.all(scanNodes(redis).map((node) => node.keys(`${space.prefix}*`)))).flat();
        expect(
          keys.filter((k) => k.startsWith(`${space.prefix}mk:`)),
          'no marker',
        ).to.deep.equal([]);
        // The audit reads every shard's watermark of a partition: keys of several slots, from their masters.
        const audited = await readWatermarks(
          redis,
          space.prefix,
          0,
          Array.from({ length: 16 }, (_, vshard) => vshard),
        );
        expect(audited.filter((offset) => offset >= 0).length, `watermarks of partition 0 read across slots: ${audited.join(',')}`).to.be.at.least(4);
        const watermarks = keys.filter((k) => /wm:\{\d+\}$/.test(k));
        expect(watermarks.length, 'watermarks on many shards').to.be.at.least(8);
        for (const key of watermarks) {
          const vshard = /\{(\d+)\}/.exec(key)![1];
          expect(keySlot(key), key).to.equal(keySlot(`${space.prefix}c:{${vshard}}:any-sku`));
        }
      });
    } finally {
      for (const daemon of daemons) await stopDaemon(daemon);
      await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix, partitions: 4 });
    }
  });

  for (const mode of ['atomic', 'two-step'] as TallyMode[]) {
    it(`${mode}${mode === 'atomic' ? ' (part-scoped)' : ''}: exact counts with duplicates and bad messages, keys on every master, and the CLI (counts, stats, status, verify) reads the cluster`, async () => {
      const space = testSpace(`cluster-${mode}`, {
        TALLY_REDIS_URL: seeds,
        TALLY_MODE: mode,
        TALLY_BATCH_SIZE: '200',
        ...(mode === 'atomic' ? { TALLY_MARKER_SCOPE: 'part' } : {}),
      });
      const dir = await mkdtemp(join(tmpdir(), 'tally-cluster-test-'));
      let daemon: DaemonProcess | null = null;
      try {
        const workload = generateWorkload({
          messages: 4_000,
          skus: 600,
          seed: mode === 'atomic' ? 51 : 52,
          duplicateRate: 0.05,
          badRate: 0.02,
          idPrefix: space.queue,
        });
        daemon = await startDaemon(space.env);
        expect(daemon.logs.some((l) => l.includes('redis cluster detected') && l.includes('"masters":3'))).to.equal(true);
        const status = await until(
          'tally status listing the daemon',
          async () => {
            const r = JSON.parse((await tallyCli(space.env, 'status', '--json')).stdout) as StatusReport;
            return r.daemons.length === 1 && r.daemons[0]!.consuming ? r : undefined;
          },
          30_000,
          300,
        );
        expect(status.daemons[0]!.pid).to.equal(daemon.child.pid);
        expect(status.layout?.mode).to.equal(mode);
        // Which marker layout the prefix has: two-step on a cluster writes one marker per message; atomic here one per
        // part, as prefixes laid out before fenced adoption (TALLY_MARKER_SCOPE=part) still are.
        expect(status.layout?.marker_scope).to.equal(mode === 'atomic' ? 'part' : 'message');
        expect((await tallyCli(space.env, 'status')).stdout).to.include(mode === 'atomic' ? 'part-scoped markers' : 'message-scoped markers');

        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
        await waitForReadyEmpty(space.queue);
        await sleep(500);
        expect((await stopDaemon(daemon)).code).to.equal(0);

        const countsOut = await tallyCli(space.env, 'counts', '--json');
        expect(countsOut.code, countsOut.stderr).to.equal(0);
        const counts = new Map(Object.entries(JSON.parse(countsOut.stdout) as Record<string, number>));
        const diff = compare(counts, workload.truth);
        expect(diff.exact, `lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
        expect(counts.size).to.equal(workload.truth.size);

        // --sku reads keys of several slots, each from its master.
        const some = [...workload.truth.keys()].slice(0, 5);
        const picked = JSON.parse((await tallyCli(space.env, 'counts', '--json', ...some.flatMap((sku) => ['--sku', sku]))).stdout) as Record<string, number>;
        for (const sku of some) expect(picked[sku], sku).to.equal(workload.truth.get(sku));

        const stats = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as Record<string, number | string | null>;
        expect(stats.mode).to.equal(mode);
        expect(stats.received).to.equal(workload.publishes.length);
        expect(stats.counted).to.equal(workload.good);
        expect((stats.duplicates as number) + (stats.partial_duplicates as number)).to.equal(workload.duplicates);
        expect(stats.dead_lettered).to.equal(workload.bad);

        const truthFile = join(dir, 'truth.json');
        await writeFile(truthFile, JSON.stringify({ counts: Object.fromEntries(workload.truth) }));
        const verified = await tallyCli(space.env, 'verify', '--truth', truthFile, '--exact', '--json');
        expect(verified.code, verified.stderr).to.equal(0);
        expect(JSON.parse(verified.stdout)).to.include({ below: 0, above: 0, exact: workload.truth.size });

        const perMaster = await withRedisAt(seeds, (redis) => countKeysPerMaster(redis, space.prefix));
        expect(perMaster).to.have.length(3);
        expect(perMaster.reduce((a, b) => a + b, 0)).to.equal(workload.truth.size);
        expect(
          perMaster.every((n) => n > 0),
          `count keys per master: ${perMaster.join(', ')}`,
        ).to.equal(true);

        const after = JSON.parse((await tallyCli(space.env, 'status', '--json')).stdout) as StatusReport;
        expect(after.daemons, 'a clean stop removes the heartbeat').to.deep.equal([]);
        console.log(`      ${mode} on the cluster: ${workload.publishes.length} publishes, exact; count keys per master ${perMaster.join('/')}`);
      } finally {
        if (daemon !== null) await stopDaemon(daemon);
        await cleanup(space);
        await rm(dir, { recursive: true, force: true });
      }
    });
  }

  /**
   * A live reshard: the slots of shards 1, 2, 9 and 14, each moved to the next master, key by key (shards 1 and 2
   * hold two-step's message markers too, marker shards being 0..3). Resolves to what moved, for the log.
   */
  async function moveFourShards(): Promise<string[]> {
    const masters = await cluster.masters();
    const moves: string[] = [];
    for (const shard of [1, 2, 9, 14]) {
      const slot = keySlot(`{${shard}}`);
      const from = masters.find((m) => m.slots.some((range) => slotIn(slot, range)))!;
      const to = masters[(masters.indexOf(from) + 1) % masters.length]!;
      const keys = await cluster.migrateSlot(slot, to.port, { keysPerStep: 10, pauseMs: 5 });
      moves.push(`{${shard}} slot ${slot}: ${keys} keys ${from.port} -> ${to.port}`);
    }
    return moves;
  }
  /** Batch steps that met a slot mid-move (or just moved) and were retried. */
  const metMovingSlot = (daemon: DaemonProcess): number =>
    daemon.logs.filter((l) => l.includes('redis step failed') && /\b(ASK|TRYAGAIN|MOVED)\b/.test(l)).length;

  for (const mode of ['atomic', 'two-step'] as TallyMode[]) {
    it(`${mode}: a live reshard mid-stream (four shards' slots moved to other masters, key by key): exact; batches that meet a slot mid-move retry until its new master serves it`, async () => {
      // Docs (scale-out.md) promise that resharding needs no change: a batch
      // whose slot is mid-move is refused before it runs (ASK or TRYAGAIN: its
      // receipt key is new, so never all of its keys are on one side) and
      // retried on the slot's master until the move is done. Its scripts also
      // reach keys they do not declare (marker hashes named from the base),
      // which a batch run on either side mid-move could read as missing.
      const space = testSpace(`cluster-reshard-${mode}`, { TALLY_REDIS_URL: seeds, TALLY_MODE: mode, TALLY_BATCH_SIZE: '200' });
      let daemon: DaemonProcess | null = null;
      try {
        const workload = generateWorkload({
          messages: 16_000,
          skus: 600,
          seed: mode === 'atomic' ? 53 : 54,
          duplicateRate: 0.05,
          badRate: 0.02,
          idPrefix: space.queue,
        });
        await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
        daemon = await startDaemon(space.env);
        await waitForReadyBelow(space.queue, (workload.publishes.length * 3) / 4, 60_000);
        const moves = await moveFourShards();
        await waitForReadyEmpty(space.queue);
        await sleep(500);
        expect((await stopDaemon(daemon)).code).to.equal(0);

        const met = metMovingSlot(daemon);
        expect(met, 'batches met a slot mid-move and retried').to.be.greaterThan(0);
        const counts = await cliCounts(space.env);
        const diff = compare(counts, workload.truth);
        expect(diff.exact, `lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
        const stats = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as Record<string, number>;
        expect(stats.counted).to.equal(workload.good);
        expect(stats.dead_lettered).to.equal(workload.bad);
        console.log(`      ${mode}, live reshard: exact; ${met} batch steps met a moving slot; ${moves.join('; ')}`);
      } finally {
        if (daemon !== null) await stopDaemon(daemon);
        await cleanup(space);
      }
    });
  }

  it('stream source: a live reshard mid-stream: exact, no marker; batches that meet a slot mid-move retry until its new master serves it', async () => {
    // Stream batches write counts and watermarks (stream_batch.lua) in the counts' slot: the same refusal mid-move.
    const space = testSpace('cluster-reshard-stream', {
      TALLY_REDIS_URL: seeds,
      TALLY_SOURCE: 'stream',
      TALLY_STREAM_CHECKPOINT_MS: '200',
      TALLY_BATCH_SIZE: '200',
    });
    let daemon: DaemonProcess | null = null;
    try {
      const workload = generateWorkload({ messages: 16_000, skus: 600, seed: 55, duplicateRate: 0.05, badRate: 0.02, idPrefix: space.queue });
      daemon = await startDaemon(space.env);
      const half = workload.publishes.length / 2;
      await publishAll(workload.publishes.slice(0, half), { url: AMQP_URL, queue: space.queue, stream: true });
      await until(
        'a quarter of the stream read',
        async () => {
          const stats = JSON.parse((await tallyCli(space.env, 'stats', '--json')).stdout) as Record<string, number>;
          return (stats.received ?? 0) >= half / 2 ? true : undefined;
        },
        60_000,
        200,
      );
      // The second half is published while the slots move: the daemon reads and writes through the moves.
      const [moves] = await Promise.all([moveFourShards(), publishAll(workload.publishes.slice(half), { url: AMQP_URL, queue: space.queue, stream: true })]);
      await untilCountsAreTheTruth(space.env, workload.truth, [daemon]);
      expect((await stopDaemon(daemon)).code).to.equal(0);
      const met = metMovingSlot(daemon);
      expect(met, 'batches met a slot mid-move and retried').to.be.greaterThan(0);
      // Settled: a second look after the stop finds the same exact counts.
      const counts = await cliCounts(space.env);
      const diff = compare(counts, workload.truth);
      expect(diff.exact, `lost ${diff.missingUnits}, excess ${diff.excessUnits}`).to.equal(true);
      await withRedisAt(seeds, async (redis) => {
        const keys = (await Promise.all(scanNodes(redis).map((node) => node.keys(`${space.prefix}mk:*`)))).flat();
        expect(keys, 'no marker').to.deep.equal([]);
      });
      console.log(`      stream, live reshard: exact; ${met} batch steps met a moving slot; ${moves.join('; ')}`);
    } finally {
      if (daemon !== null) await stopDaemon(daemon);
      await resetNamespace({ amqpUrl: AMQP_URL, redisUrl: REDIS_URL, queue: space.queue, prefix: space.prefix });
    }
  });

  it('the CLI against a seed that is down reads the cluster through the other seed', async () => {
    const space = testSpace('cluster-seed', { TALLY_REDIS_URL: `redis://127.0.0.1:1,${cluster.seedUrls[1]}` });
    const out = await tallyCli(space.env, 'stats', '--json');
    expect(out.code, out.stderr).to.equal(0);
    expect(JSON.parse(out.stdout)).to.include({ received: 0 });
  });
});

/** Slot -> the port of its master, from CLUSTER SLOTS. */
function slotMasters(reply: unknown): (slot: number) => number {
  const ranges = (reply as Array<[number, number, [string, number, ...unknown[]], ...unknown[]]>).map(([from, to, [, port]]) => ({ from, to, port }));
  return (slot) => ranges.find((range) => slot >= range.from && slot <= range.to)!.port;
}

/** Takes the dead queue's only letter and puts it back without the standing-counts header, as a copy that lost it. */
async function stripStandingHeader(deadQueue: string): Promise<void> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const channel = await connection.createConfirmChannel();
    const letter = await channel.get(deadQueue, { noAck: false });
    if (letter === false) throw new Error(`${deadQueue} is empty`);
    const { [STANDING_COUNTS_HEADER]: dropped, ...headers } = letter.properties.headers ?? {};
    expect(dropped, 'the daemon wrote the header').to.not.equal(undefined);
    channel.sendToQueue(deadQueue, letter.content, { ...letter.properties, headers });
    await channel.waitForConfirms();
    channel.ack(letter);
    await channel.close();
  } finally {
    await connection.close();
  }
}
