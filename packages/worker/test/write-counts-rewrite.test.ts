/**
 * write_counts.lua's 'rewrite' layout: a receipt a failover lost, written
 * again as the lost write was (cross-slot-counts.ts). The parts the lost
 * receipt names refused are not written, whatever their keys hold now, and
 * the new receipt names them refused too, for a rerun to read; a prior
 * refusal that names no part of the batch is refused before any write.
 */
import { randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, receiptKey } from '@tally/shared';
import { evalshaArgs, runScript } from '../src/lua-scripts.js';
import { WRITE_COUNTS } from '../src/two-step-batch.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const SHARD = 5;

describe("write_counts.lua: a lost receipt's rewrite ('rewrite' layout)", () => {
  let redis: Redis;
  before(() => {
    redis = new Redis(REDIS_URL);
  });
  after(() => redis.disconnect());

  /** Two parts on one shard: part 1 (index 1) +3 on a, part 2 +7 on b; the lost receipt named part 2 refused. */
  function rewriteOf(priorPart: number, sent: Array<string | number> = [1, 1, 1, '3']) {
    const prefix = `test:rewrite-layout:${randomUUID()}:`;
    const receipt = receiptKey(prefix, SHARD, randomUUID());
    const [keyA, keyB] = [countKey(prefix, SHARD, 'a'), countKey(prefix, SHARD, 'b')];
    const prior = [[priorPart, keyB, '7', 'WRONGTYPE Operation against a key holding the wrong kind of value']];
    // Part 2 is left out, as the worker leaves out what the lost receipt refused; only part 1's change is sent.
    const argv = [3600, 600, 'rewrite', 2, JSON.stringify(prior), ...sent];
    return { receipt, keyA, keyB, prior, run: () => runScript(redis, WRITE_COUNTS, evalshaArgs(WRITE_COUNTS, [receipt, keyA, keyB], argv), { warn() {} }) };
  }

  it('writes the parts the lost write wrote, and its receipt names the lost refusals again', async () => {
    const { receipt, keyA, keyB, prior, run } = rewriteOf(2);
    // The key that refused part 2 is gone (lost in the failover too): the rewrite must not count part 2 there.
    const reply = (await run()) as [string, string, unknown[]];
    expect(reply[0]).to.equal('written');
    expect(reply[1], 'part 2 refused, as the lost write had it').to.equal('01');
    expect(reply[2]).to.deep.equal(prior);
    expect([await redis.get(keyA), await redis.get(keyB)]).to.deep.equal(['3', null]);
    expect(await redis.get(receipt), 'a rerun reads the refusal from the receipt').to.equal(`01:${JSON.stringify(prior)}`);
    expect(await redis.ttl(receipt)).to.be.within(1, 600);

    const again = (await run()) as [string, string, unknown[]];
    expect(again, 'a rerun finds the receipt and writes nothing twice').to.deep.equal(['receipt', '01', prior]);
    expect(await redis.get(keyA)).to.equal('3');
  });

  it('refuses a part sent that a prior refusal names, before any write', async () => {
    // Part 1 first (a write the script would make), then part 2, which the lost write refused.
    const { receipt, keyA, keyB, run } = rewriteOf(2, [1, 1, 1, '3', 2, 1, 2, '7']);
    const error = await run().then(
      () => null,
      (failure: Error) => failure,
    );
    expect(error?.message).to.match(/^TALLY_SCRIPT_ARGS part 2 is sent and named by a prior refusal/);
    expect([await redis.exists(receipt), await redis.exists(keyA), await redis.exists(keyB)], 'nothing written').to.deep.equal([0, 0, 0]);
  });

  for (const part of [0, 3, 1.5]) {
    it(`refuses a prior refusal naming part ${part} of 2 before any write`, async () => {
      const { receipt, keyA, run } = rewriteOf(part);
      const error = await run().then(
        () => null,
        (failure: Error) => failure,
      );
      expect(error?.message).to.match(/^TALLY_SCRIPT_ARGS a prior refusal names part/);
      expect([await redis.exists(receipt), await redis.exists(keyA)], 'no receipt, no count').to.deep.equal([0, 0]);
    });
  }
});
