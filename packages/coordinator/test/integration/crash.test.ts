import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { shardOf } from '@tally/shared';
import { cleanup, compare, countsOf, drainWithDaemon, killDaemon, startDaemon, statsOf, testSpace, AMQP_URL } from './harness.js';

describe('crash (integration: SIGKILL of the daemon process)', function () {
  this.timeout(240_000);

  it('loses nothing and overcounts at most one batch per shard per kill', async () => {
    const batchSize = 100;
    const virtualShards = 16;
    const space = testSpace('crash', { TALLY_BATCH_SIZE: String(batchSize), TALLY_VIRTUAL_SHARDS: String(virtualShards) });
    const maxChanges = 8;
    const maxDelta = 9;
    try {
      const workload = generateWorkload({ messages: 20_000, skus: 1_000, seed: 51, duplicateRate: 0.01, idPrefix: space.queue, maxChanges, maxDelta });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const kills = 3;
      for (let k = 0; k < kills; k++) {
        const daemon = await startDaemon(space.env);
        // Kill while batches are being written: after the first batches have
        // gone out, at a moment that differs per round.
        await daemon.waitForLog('"msg":"consuming"');
        await sleep(300 + k * 250);
        const exit = await killDaemon(daemon);
        expect(exit.signal).to.equal('SIGKILL');
      }
      const exits = await drainWithDaemon(space.env, space.queue);
      expect(exits.every((e) => e.code === 0), 'clean stops after the crashes').to.equal(true);

      const counts = await countsOf(space.prefix, virtualShards);
      const diff = compare(counts, workload.truth);
      expect(diff.below, 'SKUs below the truth: data lost').to.deep.equal([]);
      // Per crash, each shard has at most one batch in its window: at most
      // batchSize parts of at most maxChanges changes of at most maxDelta.
      const perShardBound = kills * batchSize * maxChanges * maxDelta;
      const excessPerShard = new Array<number>(virtualShards).fill(0);
      for (const [sku, units] of diff.excess) excessPerShard[shardOf(sku, virtualShards)]! += units;
      for (let v = 0; v < virtualShards; v++) {
        expect(excessPerShard[v], `excess of shard ${v}`).to.be.at.most(perShardBound);
      }
      const totalExcess = excessPerShard.reduce((a, b) => a + b, 0);
      const stats = await statsOf(space.prefix);
      // The overcount is reported, never silent: with an excess there must
      // be redeliveries that found no marker.
      if (totalExcess > 0) expect(stats.redelivered_unmarked + stats.partial_duplicates).to.be.greaterThan(0);
      console.log(`      crash: ${kills} kills, excess ${totalExcess} units over ${diff.excess.size} SKUs (bound ${perShardBound} per shard), stats ${JSON.stringify(stats)}`);
    } finally {
      await cleanup(space);
    }
  });
});
