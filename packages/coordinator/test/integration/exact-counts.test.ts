import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { cleanup, compare, countsOf, drainWithDaemon, startDaemon, statsOf, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';

describe('exact counts (integration: real RabbitMQ and Redis)', function () {
  this.timeout(240_000);

  it('counts 20,000 messages over 1,000 SKUs with 2% duplicate publishes exactly', async () => {
    const space = testSpace('exact');
    try {
      const workload = generateWorkload({
        messages: 20_000,
        skus: 1_000,
        minChanges: 1,
        maxChanges: 8,
        duplicateRate: 0.02,
        seed: 11,
        idPrefix: space.queue,
        nearDuplicateShare: 0.5,
      });
      expect(workload.duplicates).to.equal(400);
      const daemon = await startDaemon(space.env);
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);
      const exit = await stopDaemon(daemon);
      expect(exit.code, 'SIGTERM exits 0').to.equal(0);

      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.below, 'SKUs below the truth').to.deep.equal([]);
      expect([...diff.excess], 'SKUs above the truth').to.deep.equal([]);
      expect(workload.truth.size).to.be.greaterThan(990);

      const stats = await statsOf(space.prefix);
      expect(stats.received).to.equal(20_400);
      expect(stats.duplicates, 'duplicates caught = duplicates injected').to.equal(400);
      expect(stats.counted).to.equal(20_000);
      expect(stats.occupation_failures).to.equal(0);
      expect(stats.dead_lettered).to.equal(0);
    } finally {
      await cleanup(space);
    }
  });

  it('counts the same id once when its copies are in flight together (invariant 4)', async () => {
    // A long batch wait keeps every copy in memory at once: the copies land in
    // the same lane before any batch flushes.
    const space = testSpace('inflight', { TALLY_BATCH_WAIT_MS: '400', TALLY_BATCH_SIZE: '10000' });
    try {
      const base = generateWorkload({ messages: 300, skus: 50, seed: 5, duplicateRate: 0, idPrefix: space.queue, idInPropertyShare: 0 });
      const repeated = base.publishes.slice(0, 20).flatMap((p) => [p, p, p]);
      const publishes = [...repeated, ...base.publishes.slice(20)];
      await publishAll(publishes, { url: AMQP_URL, queue: space.queue });
      const exits = await drainWithDaemon(space.env, space.queue);
      expect(exits.every((e) => e.code === 0)).to.equal(true);
      const diff = compare(await countsOf(space.prefix), base.truth);
      expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.duplicates).to.equal(40);
      expect(stats.counted).to.equal(300);
    } finally {
      await cleanup(space);
    }
  });

  it('filters by TALLY_ACCEPT_TYPES and skips zero deltas', async () => {
    const space = testSpace('types', { TALLY_ACCEPT_TYPES: 'sale, return' });
    try {
      const accept = new Set(['sale', 'return']);
      const workload = generateWorkload({
        messages: 2_000,
        skus: 200,
        seed: 3,
        duplicateRate: 0.05,
        idPrefix: space.queue,
        types: ['sale', 'return', 'audit'],
        acceptTypes: accept,
        minDelta: -3,
        maxDelta: 5,
      });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await drainWithDaemon(space.env, space.queue);
      const diff = compare(await countsOf(space.prefix), workload.truth);
      expect(diff.exact, `below ${diff.below.length}, above ${diff.excess.size}`).to.equal(true);
      const stats = await statsOf(space.prefix);
      expect(stats.empty, 'messages left with no accepted change').to.be.greaterThan(0);
      expect(stats.counted + stats.empty + stats.duplicates).to.equal(workload.good + workload.duplicates);
    } finally {
      await cleanup(space);
    }
  });
});
