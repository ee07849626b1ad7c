/**
 * A RabbitMQ node lost for good, on a 3-node cluster of the test's own
 * (testkit rabbit-cluster.ts) with quorum queues, every daemon given all
 * three nodes in TALLY_AMQP_URL.
 *
 * One node (A) is SIGKILLed mid-stream and never restarted. A 3-node cluster
 * survives the loss of one node only (a quorum queue needs 2 of its 3
 * replicas), so the four scenarios share that one kill, each on its own
 * queue, prefix and daemon:
 *
 *   the daemon's own node killed   daemon on A, its queue's leader on B     atomic, two-step
 *   the queue leader's node killed daemon on B or C, its queue's leader on A atomic, two-step
 *
 * A daemon's first node is the first of its list; a queue's leader is the
 * node it was declared on (RabbitMQ's client-local leader placement), so the
 * test declares each queue on its leader's node first, with the arguments
 * the daemon uses, and checks the placement. Publishing goes to C
 * throughout. Checks once drained: no daemon exited on its own; every daemon
 * on A moved to B (its log and `tally status` say so); lost 0; atomic exact;
 * two-step overcount within one batch per shard per disruption the daemon
 * saw (the node's loss, and each link it lost), and shown in its counters.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import amqp from 'amqplib';
import { generateWorkload, publishAll, type Workload } from '@tally/workload';
import { deleteKeys, startRabbitCluster, type RabbitCluster, type RabbitNode } from '@tally/testkit';
import { daemonKey, type TallyMode } from '@tally/shared';
import { declareTallyQueues } from '../src/amqp/queue-declaration.js';
import { createLogger } from '../src/process/logger.js';
import {
  pinMarkerScope,
  countsOf,
  receiptCount,
  statsOf,
  testSpace,
  withRedis,
  REDIS_URL,
  type DaemonProcess,
  type TestSpace,
} from '../test/integration/harness.js';
import { until } from '../test/integration/fleet-helpers.js';
import { largestBatchUnits, partsById, type PartsById } from '../test/integration/crash-window.js';
import { drainAt, waitForEmptyAt, waitForNodeOf } from '../test/integration/private-broker.js';
import { checkCounts } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { rows } from './report.js';

const VSHARDS = 16;
const BATCH_SIZE = 100;
const MESSAGES = 4_000;
const SHAPE = { maxChanges: 4, maxDelta: 9 };

type Victim = 'own node' | 'queue leader';

interface Scenario {
  readonly victim: Victim;
  readonly mode: TallyMode;
  /** Indexes into the cluster's nodes: A = 0 is the one killed. */
  readonly home: number;
  readonly leader: number;
  space: TestSpace;
  workload: Workload;
  parts: PartsById;
  daemon: DaemonProcess | null;
}

const portOf = (url: string): number => Number(new URL(url).port);

/** The cluster's nodes from `home` on, round the list: the daemon's TALLY_AMQP_URL. */
function nodeList(nodes: readonly RabbitNode[], home: number): string {
  return nodes.map((_, i) => nodes[(home + i) % nodes.length]!.url).join(',');
}

/** In-flight deliveries in a daemon's heartbeat, read from its key (the id is in its 'shard layout verified' line). */
async function inFlight(daemon: DaemonProcess, prefix: string): Promise<number> {
  const line = daemon.logs.find((l) => l.includes('shard layout verified'));
  const { daemonId } = JSON.parse(line!) as { daemonId: string };
  const raw = await withRedis((redis) => redis.get(daemonKey(prefix, daemonId)));
  return raw === null ? 0 : (JSON.parse(raw) as { in_flight: number }).in_flight;
}

/**
 * Publishes a slice until the broker confirms all of it, as a producer must:
 * while a queue elects a new leader its publishes are nacked. A slice sent
 * again is the same message ids: duplicates the markers catch.
 */
async function publishSlice(publishes: Workload['publishes'], url: string, queue: string): Promise<number> {
  for (let attempt = 0; ; attempt++) {
    try {
      await publishAll(publishes, { url, queue });
      return attempt;
    } catch (error) {
      if (attempt >= 60) throw error;
      await sleep(500);
    }
  }
}

describe('faults: a RabbitMQ node lost for good (3-node cluster, quorum queues)', function () {
  // It reads part-scoped markers, claims or windows by shard from Redis.
  pinMarkerScope('part');
  this.timeout(600_000);
  let cluster: RabbitCluster;

  before(async () => {
    const started = Date.now();
    cluster = await startRabbitCluster({ nodes: 3 });
    console.log(`      3-node RabbitMQ cluster up in ${Date.now() - started} ms`);
  });

  after(async () => {
    await cluster?.stop();
  });

  it('SIGKILL of a node mid-stream: daemons on it move to the next node, queues led from it elect another leader; lost 0, atomic exact, two-step within its bound', async () => {
    const started = Date.now();
    const nodes = cluster.nodes;
    const [a, b, c] = nodes as [RabbitNode, RabbitNode, RabbitNode];
    const scenarios: Scenario[] = (
      [
        { victim: 'own node', mode: 'atomic', home: 0, leader: 1 },
        { victim: 'own node', mode: 'two-step', home: 0, leader: 2 },
        { victim: 'queue leader', mode: 'atomic', home: 1, leader: 0 },
        { victim: 'queue leader', mode: 'two-step', home: 2, leader: 0 },
      ] as const
    ).map((s, i) => {
      const space = testSpace(`f-node-${s.victim.replace(' ', '-')}-${s.mode}`, {
        TALLY_AMQP_URL: nodeList(nodes, s.home),
        TALLY_QUEUE_TYPE: 'quorum',
        TALLY_MODE: s.mode,
        TALLY_BATCH_SIZE: String(BATCH_SIZE),
        // Deliveries wait up to a second in their lanes (or until the prefetch credit is used up): the kill lands with some in hand.
        TALLY_BATCH_WAIT_MS: '1000',
        TALLY_PREFETCH: '400',
        TALLY_WORKERS: '1',
        TALLY_HEARTBEAT_MS: '250',
      });
      const workload = generateWorkload({ messages: MESSAGES, skus: 400, seed: 110 + i, duplicateRate: 0.02, idPrefix: space.queue, ...SHAPE });
      return { ...s, space, workload, parts: partsById(workload.publishes, VSHARDS), daemon: null };
    });
    const fleet = new DaemonFleet();
    try {
      // Each queue led from its scenario's node: declared there first, as the daemon will declare it.
      const silent = createLogger('silent');
      for (const s of scenarios) {
        const model = await amqp.connect(nodes[s.leader]!.url);
        try {
          await declareTallyQueues(model, { queue: s.space.queue, deadLetterQueue: `${s.space.queue}.dead`, queueType: 'quorum', deliveryLimit: 20 }, silent);
        } finally {
          await model.close();
        }
        expect(await cluster.queueLeader(s.space.queue), `leader of ${s.victim}/${s.mode}`).to.equal(nodes[s.leader]!.name);
      }
      for (const s of scenarios) s.daemon = await fleet.start(s.space.env);
      for (const s of scenarios) {
        expect(portOf(await waitForNodeOf(s.space.env, s.daemon!.child.pid!)), `${s.victim}/${s.mode} starts on its first node`).to.equal(nodes[s.home]!.port);
      }

      // Publishing goes on to C in slices while A dies.
      const slices = 20;
      let slicesDone = 0;
      const publishing = (async () => {
        for (let k = 0; k < slices; k++) {
          await Promise.all(
            scenarios.map((s) => {
              const per = Math.ceil(s.workload.publishes.length / slices);
              return publishSlice(s.workload.publishes.slice(k * per, (k + 1) * per), c.url, s.space.queue);
            }),
          );
          slicesDone = k + 1;
          await sleep(250);
        }
      })();
      // Mid-stream: a third of the stream out, every daemon has written a batch, and the daemons on A hold deliveries.
      await until('a third of the stream published', async () => (slicesDone >= slices / 3 ? true : undefined), 120_000, 50);
      for (const s of scenarios)
        await until(`${s.victim}/${s.mode} writing`, async () => ((await receiptCount(s.space.prefix)) > 0 ? true : undefined), 60_000, 50);
      await until(
        'the daemons on A holding deliveries',
        async () => {
          for (const s of scenarios) if (s.home === 0 && (await inFlight(s.daemon!, s.space.prefix)) === 0) return undefined;
          return true;
        },
        60_000,
        20,
      );
      const killedAt = Date.now();
      await cluster.kill(a.name);
      expect(cluster.node(a.name).alive).to.equal(false);

      for (const s of scenarios.filter((x) => x.home === 0)) {
        const moved = await waitForNodeOf(s.space.env, s.daemon!.child.pid!, null, 60_000).then(async (node) =>
          portOf(node) === a.port ? waitForNodeOf(s.space.env, s.daemon!.child.pid!, node, 60_000) : node,
        );
        expect(portOf(moved), `${s.victim}/${s.mode} moved to the next node of its list`).to.equal(b.port);
      }
      const movedMs = Date.now() - killedAt;
      await publishing;
      for (const s of scenarios) await waitForEmptyAt(c.url, s.space.queue, 240_000);
      await sleep(1_000);
      for (const s of scenarios) await fleet.stop(s.daemon!);
      expect(fleet.violations, 'no daemon exited on its own').to.deep.equal([]);
      // Whatever a stop handed back: one more daemon each, given the survivors only through the same list.
      for (const s of scenarios) await drainAt(s.space.env, c.url, s.space.queue);

      for (const s of scenarios) {
        const logs = s.daemon!.logs;
        const linkLosses = logs.filter((l) => l.includes('amqp link lost')).length;
        const check = checkCounts(await countsOf(s.space.prefix, VSHARDS), s.workload.truth, VSHARDS);
        const stats = await statsOf(s.space.prefix);
        // One batch per shard per disruption: the node's loss itself, and each link the daemon lost.
        const disruptions = 1 + linkLosses;
        const bound = Array.from({ length: VSHARDS }, (_, v) => (s.mode === 'atomic' ? 0 : disruptions * largestBatchUnits(s.parts, v, BATCH_SIZE)));
        rows.push({
          scenario: `broker node lost: ${s.victim} (${s.mode})`,
          messages: s.workload.publishes.length,
          kills: 1,
          lost: check.lostUnits,
          overcount: check.overcountUnits,
          bound: bound.reduce((x, y) => x + y, 0),
          estimate: 0,
          note: `daemon on ${s.home === 0 ? 'A (killed)' : s.home === 1 ? 'B' : 'C'}, leader on ${s.leader === 0 ? 'A (killed)' : s.leader === 1 ? 'B' : 'C'}; ${linkLosses} link losses; redelivered_unmarked ${stats.redelivered_unmarked}`,
        });
        console.log(
          `      ${s.victim}, ${s.mode}: lost ${check.lostUnits}, overcount ${check.overcountUnits} units; ${linkLosses} link losses; received ${stats.received} of ${s.workload.publishes.length}`,
        );
        if (s.home === 0) {
          expect(linkLosses, `${s.victim}/${s.mode}: the link to A was lost`).to.be.at.least(1);
          // Mid-stream for real: what the lost channel held came back from the broker.
          expect(stats.received, `${s.victim}/${s.mode}: deliveries of the lost channel redelivered`).to.be.greaterThan(s.workload.publishes.length);
          expect(
            logs.some((l) => l.includes('"msg":"consuming"') && l.includes(`:${b.port}`)),
            `${s.victim}/${s.mode} logged consuming on B`,
          ).to.equal(true);
        }
        expect(check.lostSkus, `${s.victim}/${s.mode}: SKUs below the truth`).to.deep.equal([]);
        if (s.mode === 'atomic') expect(check.overcountUnits, `${s.victim}/atomic overcount`).to.equal(0);
        for (let v = 0; v < VSHARDS; v++) expect(check.excessPerShard[v], `${s.victim}/${s.mode}: excess of shard ${v}`).to.be.at.most(bound[v]!);
        if (check.overcountUnits > 0) expect(stats.redelivered_unmarked + stats.partial_duplicates, 'an overcount shows in the counters').to.be.greaterThan(0);
      }
      console.log(`      node lost: daemons on it moved in ${movedMs} ms; scenario ${Date.now() - started} ms`);
    } finally {
      await fleet.killAll();
      for (const s of scenarios) await deleteKeys(REDIS_URL, s.space.prefix);
    }
  });
});
