import { expect } from 'chai';
import { generateWorkload, publishAll, seededRandom, type Publish } from '@tally/workload';
import { cleanup, countsOf, statsOf, testSpace, waitForReadyEmpty, AMQP_URL } from '../test/integration/harness.js';
import { checkCounts, checkDeadLetters } from './checks.js';
import { DaemonFleet } from './fleet.js';
import { hostileCorpus, unicodeGood } from './hostile-corpus.js';
import { rows } from './report.js';

/**
 * Hostile bodies mixed into a good stream (hostile-corpus.ts: random bytes,
 * deep nesting, huge arrays, wrong types, empty SKUs, lone surrogates,
 * oversized bodies; and good messages with well-formed unicode SKUs): each
 * hostile one is dead-lettered with its reason, every good one counted
 * exactly, and the daemon keeps at least a fifth of its clean throughput,
 * measured on the same workload without them.
 */
/** Messages per second from the moment the daemon consumes until nothing is ready. */
async function drainRate(fleet: DaemonFleet, env: Record<string, string>, queue: string, messages: number): Promise<number> {
  const daemon = await fleet.start(env);
  const started = performance.now();
  await waitForReadyEmpty(queue, 240_000);
  const seconds = (performance.now() - started) / 1000;
  // Let the last prefetch window finish, then stop: exit 0 is part of the check.
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  await fleet.stop(daemon);
  return messages / seconds;
}

describe('faults: hostile input mid-stream', function () {
  this.timeout(300_000);

  it('dead-letters every hostile message with its reason and keeps at least a fifth of its clean throughput', async () => {
    const virtualShards = 16;
    const maxBytes = 65_536;
    const space = testSpace('f-hostile');
    const fleet = new DaemonFleet();
    const random = seededRandom(53);
    try {
      // The clean run, same daemon settings, same queue.
      const clean = generateWorkload({ messages: 20_000, skus: 2_000, seed: 59, duplicateRate: 0.02, idPrefix: `${space.queue}-clean` });
      await publishAll(clean.publishes, { url: AMQP_URL, queue: space.queue });
      const cleanRate = await drainRate(fleet, space.env, space.queue, clean.publishes.length);

      // The hostile run: as many good messages, with the corpus mixed in at random places.
      const good = generateWorkload({ messages: 20_000, skus: 2_000, seed: 61, duplicateRate: 0.02, idPrefix: `${space.queue}-good` });
      const hostile = hostileCorpus(67, 400, maxBytes, `${space.queue}-bad`);
      const unicode = unicodeGood(71, 100, `${space.queue}-uni`);
      const mixed: Publish[] = [...good.publishes];
      const insert = (publish: Publish) => mixed.splice(Math.floor(random() * (mixed.length + 1)), 0, publish);
      hostile.forEach((sample, i) => insert({ kind: 'bad', body: sample.body, messageId: `${space.queue}-hostile-${i}` }));
      for (const message of unicode) insert({ kind: 'good', body: message.body });
      await publishAll(mixed, { url: AMQP_URL, queue: space.queue });
      const hostileRate = await drainRate(fleet, space.env, space.queue, mixed.length);

      const truth = new Map(clean.truth);
      for (const [sku, value] of good.truth) truth.set(sku, (truth.get(sku) ?? 0) + value);
      for (const message of unicode) truth.set(message.sku, (truth.get(message.sku) ?? 0) + message.delta);
      const check = checkCounts(await countsOf(space.prefix, virtualShards), truth, virtualShards);
      const stats = await statsOf(space.prefix);
      const dead = await checkDeadLetters(
        space.queue,
        hostile.map((sample, i) => ({ body: sample.body, messageId: `${space.queue}-hostile-${i}`, codes: sample.codes })),
      );
      const kinds = new Map<string, number>();
      for (const sample of hostile) kinds.set(sample.kind, (kinds.get(sample.kind) ?? 0) + 1);
      rows.push({
        scenario: 'hostile input (fast-check)',
        messages: clean.publishes.length + mixed.length,
        kills: 0,
        lost: check.lostUnits,
        overcount: check.overcountUnits,
        bound: 0,
        estimate: 0,
        note: `${hostile.length} hostile in ${kinds.size} kinds + ${unicode.length} unicode SKUs; ${Math.round(hostileRate)} msg/s vs ${Math.round(cleanRate)} clean`,
      });
      console.log(`      kinds ${JSON.stringify(Object.fromEntries(kinds))}; clean ${cleanRate.toFixed(0)} msg/s, hostile ${hostileRate.toFixed(0)} msg/s`);

      expect(fleet.violations, 'a daemon exited on its own').to.deep.equal([]);
      expect(kinds.size, 'the corpus covers most kinds').to.be.at.least(10);
      expect(dead.missing, 'hostile messages missing from the dead-letter queue').to.equal(0);
      expect(dead.foreign, 'good messages dead-lettered').to.equal(0);
      expect(dead.repeats).to.equal(0);
      expect(dead.withoutReason).to.equal(0);
      expect(dead.wrongReasons).to.deep.equal([]);
      expect(stats.dead_lettered).to.equal(hostile.length);
      expect(check.lostSkus, 'SKUs below the truth, unicode ones included').to.deep.equal([]);
      expect(check.overcountUnits, 'no crash, no overcount').to.equal(0);
      expect(hostileRate, `hostile ${hostileRate.toFixed(0)} msg/s against clean ${cleanRate.toFixed(0)} msg/s`).to.be.at.least(cleanRate / 5);
    } finally {
      await fleet.killAll();
      await cleanup(space);
    }
  });
});
