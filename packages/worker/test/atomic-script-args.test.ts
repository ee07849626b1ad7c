/**
 * atomic_batch.lua refuses arguments that disagree, before it writes
 * anything: the checks a worker bug would meet, each proven by a call built
 * by hand from a valid one. Without `index > m`, for one, a part's changes
 * fall out of step with the count keys: a probe lost a part's 500 and still
 * occupied its marker. A refusal is TALLY_SCRIPT_ARGS with no count, no
 * marker and no receipt; a part with no changes is a part, not a refusal.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, type BatchTask } from '@tally/shared';
import { markerEntry, readMarkers, testWorkerSettings } from '@tally/testkit';
import { ATOMIC_BATCH, atomicBatchArgs } from '../src/atomic-batch.js';
import type { ScriptArg } from '../src/lua-scripts.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const VSHARD = 3;

/** A call as the worker builds it: args[0] the SHA, args[1] the key count, then KEYS, then ARGV. */
class ScriptCall {
  constructor(readonly args: ScriptArg[]) {}

  get keyCount(): number {
    return Number(this.args[1]);
  }

  /** ARGV[k], 1-based as in the script's header. */
  argv(k: number): ScriptArg {
    return this.args[1 + this.keyCount + k]!;
  }

  withArgv(k: number, value: ScriptArg): ScriptCall {
    const args = [...this.args];
    args[1 + this.keyCount + k] = value;
    return new ScriptCall(args);
  }

  /** The same call in the 'parts' layout: every part's changes read, no sums. */
  inPartsLayout(): ScriptCall {
    const m = Number(this.argv(4));
    const args = [...this.args];
    args[1 + this.keyCount + 7] = 'parts';
    args.splice(1 + this.keyCount + 12, 2 * m);
    return new ScriptCall(args);
  }

  get argvLength(): number {
    return this.args.length - 2 - this.keyCount;
  }
}

describe('atomic_batch.lua: arguments that disagree are refused before anything is written', function () {
  this.timeout(30_000);
  let redis: Redis;
  let prefix: string;
  let runId: string;

  beforeEach(async () => {
    runId = randomBytes(4).toString('hex');
    prefix = `t.atomic-args.${runId}:`;
    redis = new Redis(REDIS_URL);
    await redis.script('LOAD', ATOMIC_BATCH.source);
  });
  afterEach(async () => {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  /** Two parts, two SKUs: part 1 adds 5 to A, part 2 adds 500 to B (ARGV[13], ARGV[15] hold their texts in 'parts'). */
  function call(task?: Partial<BatchTask> & { ids?: string[] }): { call: ScriptCall; task: BatchTask & { ids: string[] } } {
    const ids = task?.ids ?? [`${runId}-1`, `${runId}-2`];
    const full = {
      vshard: VSHARD,
      batchId: randomUUID(),
      ids,
      changes: task?.changes ?? [[['A', 5]], [['B', 500]]],
    } as BatchTask & { ids: string[] };
    const settings = testWorkerSettings({ redisUrl: REDIS_URL, prefix, mode: 'atomic' });
    return { call: new ScriptCall(atomicBatchArgs(settings, full, full.batchId)), task: full };
  }

  async function run(script: ScriptCall): Promise<unknown> {
    return redis.evalsha(...(script.args as [string, number, ...ScriptArg[]]));
  }

  async function expectRefusedUntouched(script: ScriptCall, task: BatchTask & { ids: string[] }, what: string): Promise<void> {
    let thrown: unknown = null;
    try {
      await run(script);
    } catch (error) {
      thrown = error;
    }
    expect(thrown, `${what}: refused`).to.be.instanceOf(Error);
    expect((thrown as Error).message, what).to.match(/^TALLY_SCRIPT_ARGS /);
    expect(await redis.keys(`${prefix}*`), `${what}: nothing written, not even the receipt`).to.deep.equal([]);
    const { done } = await readMarkers(redis, prefix);
    expect(
      task.ids.filter((id) => done.has(markerEntry(VSHARD, id))),
      `${what}: no marker`,
    ).to.deep.equal([]);
  }

  it("refuses a change that is not 'index:delta' with 1 <= index <= m in canonical decimals ('parts' layout)", async () => {
    // m = 2: index 3 would read KEYS[5], which is not a count key of this batch.
    for (const text of ['0:5', '3:5', '2:5,', ',2:5', '2:+5', '2:05', '02:5', '2:-0', '2:5.0', '2:0x10', '2:', ':5', '2:9007199254740992']) {
      const { call: valid, task } = call();
      const parts = valid.inPartsLayout();
      expect(parts.argv(15), 'the second part is ARGV[15] in this layout').to.equal('2:500');
      await expectRefusedUntouched(parts.withArgv(15, text), task, `'${text}'`);
    }
  });

  it("refuses a bad change in a duplicate ('sums' layout reads a duplicate's changes to take them off)", async () => {
    // The same id twice: the second part is a duplicate of the first, and its changes are read.
    const { call: valid, task } = call({ ids: [`${runId}-1`, `${runId}-1`], changes: [[['A', 5]], [['A', 5]]] });
    expect(valid.argv(7)).to.equal('sums');
    const m = Number(valid.argv(4));
    const secondText = 11 + 2 * m + 4;
    expect(valid.argv(secondText)).to.equal('1:5');
    for (const text of ['0:5', '2:5', '1:5,', '1:+5', '1:-0']) {
      await expectRefusedUntouched(valid.withArgv(secondText, text), task, `duplicate '${text}'`);
    }
  });

  it('refuses an argument count that does not match n and m, in both layouts', async () => {
    for (const layout of ['sums', 'parts'] as const) {
      const { call: valid, task } = call();
      const script = layout === 'sums' ? valid : valid.inPartsLayout();
      const shorter = new ScriptCall(script.args.slice(0, -1));
      const longer = new ScriptCall([...script.args, '1:1']);
      await expectRefusedUntouched(shorter, task, `${layout}, one argument short`);
      await expectRefusedUntouched(longer, task, `${layout}, one argument more`);
      await expectRefusedUntouched(script.withArgv(3, 3), task, `${layout}, n says 3 parts`);
      await expectRefusedUntouched(script.withArgv(3, '1.5'), task, `${layout}, n not whole`);
      await expectRefusedUntouched(script.withArgv(4, 1), task, `${layout}, m says 1 count key`);
      await expectRefusedUntouched(script.withArgv(4, -2), task, `${layout}, m negative`);
      // Refused after the INCRBYs, a count TTL aborted the script with counts written and no receipt or marker.
      for (const [k, name] of [
        [1, 'marker TTL'],
        [2, 'count TTL'],
        [5, 'bucket width'],
        [6, 'sub-buckets'],
      ] as const) {
        for (const bad of ['x', 0, '1.5']) await expectRefusedUntouched(script.withArgv(k, bad), task, `${layout}, ${name} ${bad}`);
      }
      expect(script.argvLength, `${layout}: the valid call is counted in full`).to.be.greaterThan(11);
    }
  });

  it('reads a part with no changes as a part: counted (nothing to add), its marker occupied; as a duplicate, nothing taken off', async () => {
    for (const layout of ['sums', 'parts'] as const) {
      const empty = `${runId}-${layout}-empty`;
      const { call: valid } = call({ ids: [empty, empty, `${runId}-${layout}-x`], changes: [[], [], [[layout, 7]]] });
      const script = layout === 'sums' ? valid : valid.inPartsLayout();
      const [flags, refusals] = (await run(script)) as [string, unknown[]];
      expect(flags, `${layout}: the empty part counted, its twin a duplicate`).to.equal('010');
      expect(refusals, layout).to.deep.equal([]);
      expect(await redis.get(countKey(prefix, VSHARD, layout)), `${layout}: only the other part's count`).to.equal('7');
      const { done } = await readMarkers(redis, prefix);
      expect(done.has(markerEntry(VSHARD, empty)), `${layout}: the empty part's marker`).to.equal(true);
    }
  });

  it('counts the valid call it tampers with: the refusals above are the changes, not the call', async () => {
    for (const layout of ['sums', 'parts'] as const) {
      const { call: valid } = call({ ids: [`${runId}-${layout}-1`, `${runId}-${layout}-2`] });
      const [flags] = (await run(layout === 'sums' ? valid : valid.inPartsLayout())) as [string];
      expect(flags, layout).to.equal('00');
      expect(await redis.mget(countKey(prefix, VSHARD, 'A'), countKey(prefix, VSHARD, 'B')), layout).to.deep.equal(
        layout === 'sums' ? ['5', '500'] : ['10', '1000'],
      );
    }
  });
});
