/**
 * Fenced adoption's script steps (bench/results/notes/cluster-floor.md),
 * against a real Redis: the claim that names its batch and hands on the
 * chain of the claims it took over (claim_markers.lua's ARGV[9]), the count
 * write that fences the chain's batches or adopts what they counted
 * (write_counts.lua's 'chains' layout and its 'fenced' answer), and the
 * take-back that leaves an adopted part alone and records what it took
 * back (take_back_counts.lua with 'chains'). Each test plays the batches'
 * steps in the order a crash or a pause would leave them.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { countKey, markerBaseKey, receiptKey, ScriptReply } from '@tally/shared';
import { TAKE_BACK_COUNTS, takeBackReceiptId } from '../src/cross-slot-counts.js';
import { evalshaArgs, runScript, type ScriptArg } from '../src/lua-scripts.js';
import { CLAIM_MARKERS, WRITE_COUNTS } from '../src/two-step-batch.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const quiet = { warn() {} };
const COUNT_TTL_S = 3600;
const RECEIPT_TTL_S = 600;

type ClaimReply = [string, number, number, number, number, Array<number | string>];
type WriteReply = [string, string, unknown[]];
type TakeBackReply = Array<[string, unknown]>;

/** One part of a 'chains' write: its batch index, digest, chain (KEYS indexes) and changes (KEYS index, delta). */
interface ChainsPart {
  index: number;
  digest: Buffer;
  chain?: number[];
  changes: Array<[number, string]>;
}

function chainsArgv(parts: number, sent: readonly ChainsPart[], prior: unknown[] = [], held: readonly Buffer[] = []): ScriptArg[] {
  const argv: ScriptArg[] = [COUNT_TTL_S, RECEIPT_TTL_S, 'chains', parts, JSON.stringify(prior), held.length, ...held];
  for (const part of sent) {
    const chain = part.chain ?? [];
    argv.push(part.index, part.digest, chain.length, ...chain, part.changes.length);
    for (const [key, delta] of part.changes) argv.push(key, delta);
  }
  return argv;
}

describe('fenced adoption: the scripts', () => {
  let redis: Redis;
  before(() => {
    redis = new Redis(REDIS_URL);
  });
  after(() => redis.disconnect());
  /** A set of digests, as hex. */
  const members = async (key: string) => (await redis.smembersBuffer(key)).map((member) => member.toString('hex')).sort();

  describe('claim_markers.lua: the claim names its batch and hands on its chain', () => {
    const VSHARD = 2;
    /** One claim call: a daemon's token, its batch id ('' for none), the claim TTL that decides "expired". */
    const claimer =
      (prefix: string) =>
      (token: string, batchId: string, claimTtlMs: number, ...digests: Buffer[]) =>
        runScript(
          redis,
          CLAIM_MARKERS,
          evalshaArgs(CLAIM_MARKERS, [markerBaseKey(prefix, VSHARD)], [60, 600, 4, 0, token, claimTtlMs, '', '', batchId, ...digests]),
          quiet,
        ) as Promise<ClaimReply>;
    const meta = (prefix: string, bucket: number) => `${markerBaseKey(prefix, VSHARD)}:${bucket}:m`;
    const aLittleLater = () => new Promise((resolve) => setTimeout(resolve, 5));

    it('records the batch id in the claim, and nothing more without one', async () => {
      const prefix = `test:fenced-claim:${randomUUID()}:`;
      const claim = claimer(prefix);
      const [flags, bucket, , batch, , chains] = await claim('aa', 'X', 30_000, randomBytes(16));
      expect([flags, chains]).to.deep.equal(['0', []]);
      expect(await redis.hget(meta(prefix, bucket), `b${batch}`)).to.match(/^caa:X:\d+$/);
      const plain = await claim('aa', '', 30_000, randomBytes(16));
      expect(await redis.hget(meta(prefix, plain[1]), `b${plain[3]}`), 'no id: the record as older builds write it').to.match(/^caa:\d+$/);
    });

    it("adopts another daemon's expired claim, and each adopter hands on the chain with the id it took over", async () => {
      const prefix = `test:fenced-claim:${randomUUID()}:`;
      const claim = claimer(prefix);
      const [d, fresh] = [randomBytes(16), randomBytes(16)];
      await claim('aa', 'X', 30_000, d);
      const live = await claim('bb', 'C', 30_000, d, fresh);
      expect([live[0], live[5]], "X's claim is live: held, nothing adopted").to.deep.equal(['20', []]);

      await aLittleLater();
      const c = await claim('bb', 'C', 1, d, fresh);
      expect([c[0], c[2], c[5]], "X ran out: C adopts d from X; the other part is C's own claim, with no chain").to.deep.equal(['00', 1, [1, 'X']]);
      expect(await redis.hget(meta(prefix, c[1]), Buffer.concat([Buffer.from(`a${c[3]}:`), d]))).to.equal('X');

      await aLittleLater();
      const dd = await claim('cc', 'D', 1, fresh, d);
      expect([dd[0], dd[5]], 'C ran out too: D adopts d from X then C, and the fresh part from C').to.deep.equal(['00', [1, 'C', 2, 'X C']]);
    });

    it("adopts this daemon's claim under another id at once, and hands on a rerun's chain as it is", async () => {
      const prefix = `test:fenced-claim:${randomUUID()}:`;
      const claim = claimer(prefix);
      const d = randomBytes(16);
      await claim('aa', 'X', 30_000, d);
      const y = await claim('aa', 'Y', 30_000, d);
      expect([y[0], y[2], y[5]], 'X ended (split, fenced, its thread dead): Y adopts it, not as a takeover').to.deep.equal(['0', 0, [1, 'X']]);
      const rerun = await claim('aa', 'Y', 30_000, d);
      expect([rerun[0], rerun[5]], "Y's rerun: its own claim, the chain as Y had it").to.deep.equal(['0', [1, 'X']]);
      const plain = await claim('aa', '', 30_000, d);
      expect([plain[0], plain[5]], 'without an id, an own claim is taken again as before').to.deep.equal(['0', []]);
    });
  });

  describe("write_counts.lua's 'chains' layout and take_back_counts.lua with 'chains'", () => {
    const SHARD = 7;
    /** A shard's receipts and counts, fresh for each test. */
    function shard() {
      const prefix = `test:fenced-write:${randomUUID()}:`;
      const receipt = (batchId: string) => receiptKey(prefix, SHARD, batchId);
      const counts = { a: countKey(prefix, SHARD, 'a'), b: countKey(prefix, SHARD, 'b') };
      const write = (keys: string[], argv: ScriptArg[]) => runScript(redis, WRITE_COUNTS, evalshaArgs(WRITE_COUNTS, keys, argv), quiet) as Promise<WriteReply>;
      /** One batch's sums on a and b, as an ordinary first write sends them. */
      const sums = (batchId: string, a: number, b: number) => write([receipt(batchId), counts.a, counts.b], [COUNT_TTL_S, RECEIPT_TTL_S, 'sums', '00', a, b]);
      /** `batchId`'s take-back of parts (index, digest, delta on a) under its 'chains' receipts; `chain`: the ids a part was adopted from here. */
      const takeBack = (batchId: string, parts: Array<[number, Buffer, number]>, chain: string[] = []) => {
        const keys = [
          ...parts.map(([index]) => receiptKey(prefix, SHARD, takeBackReceiptId(batchId, index))),
          receipt(batchId),
          ...chain.map(receipt),
          counts.a,
        ];
        const chainAt = chain.map((_, j) => parts.length + 2 + j);
        return runScript(
          redis,
          TAKE_BACK_COUNTS,
          evalshaArgs(TAKE_BACK_COUNTS, keys, [
            COUNT_TTL_S,
            RECEIPT_TTL_S,
            parts.length,
            'chains',
            ...parts.flatMap(([, digest]) => [digest, chainAt.length, ...chainAt]),
            ...parts.flatMap(([, , delta]) => [1, keys.length, String(-delta)]),
          ]),
          quiet,
        ) as Promise<TakeBackReply>;
      };
      const read = async () => [await redis.get(counts.a), await redis.get(counts.b)];
      return { receipt, counts, write, sums, takeBack, read };
    }

    it('fences a batch of the chain that never wrote here, writes the part, and the fenced batch writes nothing, ever', async () => {
      const { receipt, counts, write, sums, read } = shard();
      const d = randomBytes(16);
      const reply = await write([receipt('C'), counts.a, receipt('X')], chainsArgv(1, [{ index: 1, digest: d, chain: [3], changes: [[2, '5']] }]));
      expect(reply).to.deep.equal([ScriptReply.WRITE_WRITTEN, '', []]);
      expect(await redis.get(receipt('X'))).to.equal('fenced');
      expect(await redis.ttl(receipt('X')), 'a fence lives the count TTL').to.be.within(RECEIPT_TTL_S + 1, COUNT_TTL_S);

      // X was only paused: it wakes up and writes d (and another message) here.
      expect(await sums('X', 5, 3)).to.deep.equal([ScriptReply.WRITE_FENCED, '', []]);
      expect(await read(), 'counted once, by C; nothing of X').to.deep.equal(['5', null]);
      expect(await redis.get(receipt('X'))).to.equal('fenced');
    });

    it('adopts what a batch of the chain counted here: not written again, and its take-back leaves it', async () => {
      const { receipt, counts, write, sums, takeBack, read } = shard();
      const [d, e, other] = [randomBytes(16), randomBytes(16), randomBytes(16)];
      // X counted d (+5 on a) and another message (+1 on a) here, then died before occupying their markers.
      expect((await sums('X', 6, 0))[0]).to.equal(ScriptReply.WRITE_WRITTEN);
      const cWrite = () =>
        write(
          [receipt('C'), counts.a, counts.b, receipt('X')],
          chainsArgv(2, [
            { index: 1, digest: d, chain: [4], changes: [[2, '5']] },
            { index: 2, digest: e, changes: [[3, '2']] },
          ]),
        );
      expect(await cWrite(), "C adopts d, X's; e is C's own").to.deep.equal([ScriptReply.WRITE_WRITTEN, `${ScriptReply.WRITE_PART_ADOPTED}0`, []]);
      expect(await read(), 'd counted once, by X').to.deep.equal(['6', '2']);
      expect(await redis.hget(`${receipt('X')}~adopted`, d), 'adopted by C').to.equal(receipt('C'));
      expect(await members(`${receipt('C')}~out`), 'C did not count d here: the next adopter reads so').to.deep.equal([d.toString('hex')]);
      expect(await redis.get(receipt('C'))).to.equal('20:[]');
      expect(await cWrite(), "C's rerun finds its receipt: the same answer, nothing written").to.deep.equal([ScriptReply.WRITE_RECEIPT, '20', []]);
      expect(await read()).to.deep.equal(['6', '2']);

      // X, only paused, wakes up and abandons (a refusal on another shard): d is C's now, the other message still X's.
      const taken = await takeBack('X', [
        [1, d, 5],
        [2, other, 1],
      ]);
      expect(taken.map(([outcome]) => outcome)).to.deep.equal([ScriptReply.TAKE_BACK_ADOPTED, ScriptReply.TAKE_BACK_TAKEN]);
      expect(await read(), "d stands, X's other message is taken back").to.deep.equal(['5', '2']);
      expect(await members(`${receipt('X')}~out`)).to.deep.equal([other.toString('hex')]);
    });

    it('an adopter that takes back what it adopted takes it back for the chain too: the next adopter writes it again', async () => {
      const { receipt, counts, write, sums, takeBack, read } = shard();
      const d = randomBytes(16);
      await sums('X', 5, 0);
      const cKeys = [receipt('C'), counts.a, receipt('X')];
      expect((await write(cKeys, chainsArgv(1, [{ index: 1, digest: d, chain: [3], changes: [[2, '5']] }])))[1]).to.equal('2');
      // d is refused on another shard of C's: C takes back here the counts it adopted from X.
      expect((await takeBack('C', [[1, d, 5]], ['X']))[0]![0]).to.equal(ScriptReply.TAKE_BACK_TAKEN);
      expect(await read()).to.deep.equal(['0', '0']);
      expect(await members(`${receipt('X')}~out`), 'X no longer stands for d here').to.deep.equal([d.toString('hex')]);
      // X, woken, takes back d: C did already, and X's take-back finds d adopted.
      expect((await takeBack('X', [[1, d, 5]]))[0]![0]).to.equal(ScriptReply.TAKE_BACK_ADOPTED);
      // d's dead letter replayed: its claim, X's in an older bucket, is adopted again, and d is written.
      const r = await write([receipt('R'), counts.a, receipt('X')], chainsArgv(1, [{ index: 1, digest: d, chain: [3], changes: [[2, '5']] }]));
      expect(r[1]).to.equal('');
      expect(await read(), 'counted once').to.deep.equal(['5', '0']);
    });

    it('an adopter taken over in turn leaves the part to the next adopter: its take-back finds it adopted since', async () => {
      const { receipt, counts, write, sums, takeBack, read } = shard();
      const d = randomBytes(16);
      // W counted d and stalled; X adopted d (and stalled before taking it back); D adopted d from W and X.
      await sums('W', 5, 0);
      await write([receipt('X'), counts.a, receipt('W')], chainsArgv(1, [{ index: 1, digest: d, chain: [3], changes: [[2, '5']] }]));
      const dReply = await write(
        [receipt('D'), counts.a, receipt('W'), receipt('X')],
        chainsArgv(1, [{ index: 1, digest: d, chain: [3, 4], changes: [[2, '5']] }]),
      );
      expect(dReply[1]).to.equal('2');
      expect(await redis.hget(`${receipt('W')}~adopted`, d), "W's count is D's now").to.equal(receipt('D'));
      // X wakes: d was refused on another of its shards. It must not take back the count D relies on.
      expect((await takeBack('X', [[1, d, 5]], ['W']))[0]![0]).to.equal(ScriptReply.TAKE_BACK_ADOPTED);
      expect(await read(), 'd still counted once').to.deep.equal(['5', '0']);
    });

    it('names the parts a run does not write in its ~out: an adopter of a part held at the rerun writes it', async () => {
      const { receipt, counts, write, read } = shard();
      const [d, e] = [randomBytes(16), randomBytes(16)];
      // X's rerun finds d held by C (which took X's claim over) and writes only e here.
      await write([receipt('X'), counts.a, counts.b], chainsArgv(2, [{ index: 2, digest: e, changes: [[3, '2']] }], [], [d]));
      expect(await members(`${receipt('X')}~out`)).to.deep.equal([d.toString('hex')]);
      const c = await write([receipt('C'), counts.a, receipt('X')], chainsArgv(1, [{ index: 1, digest: d, chain: [3], changes: [[2, '5']] }]));
      expect(c[1], 'X did not count d here: C writes it').to.equal('');
      expect(await read()).to.deep.equal(['5', '2']);
    });

    it('writes again what a batch of the chain took back or had refused here', async () => {
      const { receipt, counts, write, takeBack, read } = shard();
      const [d, refused] = [randomBytes(16), randomBytes(16)];
      await redis.set(counts.b, 'not a number');
      const x = await write(
        [receipt('X'), counts.a, counts.b],
        chainsArgv(2, [
          { index: 1, digest: d, changes: [[2, '5']] },
          { index: 2, digest: refused, changes: [[3, '4']] },
        ]),
      );
      expect([x[0], x[1]], "X's second part refused on b").to.deep.equal([ScriptReply.WRITE_WRITTEN, '01']);
      expect(await members(`${receipt('X')}~out`)).to.deep.equal([refused.toString('hex')]);
      // X takes back d here (refused on another shard) before anyone adopts it.
      expect((await takeBack('X', [[1, d, 5]]))[0]![0]).to.equal(ScriptReply.TAKE_BACK_TAKEN);
      expect(await read(), 'taken back to 0').to.deep.equal(['0', 'not a number']);

      await redis.del(counts.b);
      const c = await write(
        [receipt('C'), counts.a, counts.b, receipt('X')],
        chainsArgv(2, [
          { index: 1, digest: d, chain: [4], changes: [[2, '5']] },
          { index: 2, digest: refused, chain: [4], changes: [[3, '4']] },
        ]),
      );
      expect(c, 'X left neither counted here: C writes both').to.deep.equal([ScriptReply.WRITE_WRITTEN, '', []]);
      expect(await read()).to.deep.equal(['5', '4']);
      expect(await redis.exists(`${receipt('X')}~adopted`)).to.equal(0);
    });

    it('reads the whole chain: a part counted by any batch of it is adopted, one counted by none is written', async () => {
      const { receipt, counts, write, sums, read } = shard();
      const [d, e] = [randomBytes(16), randomBytes(16)];
      // X counted d here and died; C adopted d (skipped here) and wrote e, then died too; D adopts both from X then C.
      await sums('X', 5, 0);
      await write(
        [receipt('C'), counts.a, counts.b, receipt('X')],
        chainsArgv(2, [
          { index: 1, digest: d, chain: [4], changes: [[2, '5']] },
          { index: 2, digest: e, changes: [[3, '2']] },
        ]),
      );
      const keys = [receipt('D'), counts.a, counts.b, receipt('X'), receipt('C'), receipt('W')];
      const dReply = await write(
        keys,
        chainsArgv(3, [
          { index: 1, digest: d, chain: [4, 5], changes: [[2, '5']] },
          { index: 2, digest: e, chain: [5], changes: [[3, '2']] },
          // A third message whose chain's only batch (W) never came here: fenced, and written.
          { index: 3, digest: randomBytes(16), chain: [6], changes: [[3, '1']] },
        ]),
      );
      expect(dReply[1]).to.equal('220');
      expect(await read(), 'd once (X), e once (C), the third once (D)').to.deep.equal(['5', '3']);
      expect(await redis.get(receipt('W'))).to.equal('fenced');
    });

    it('refuses arguments that do not parse, and sets of a foreign type, before any write', async () => {
      const { receipt, counts, write, read } = shard();
      const fails = (keys: string[], argv: ScriptArg[]) =>
        write(keys, argv).then(
          () => null,
          (failure: Error) => failure.message,
        );
      const d = randomBytes(16);
      const good = { index: 1, digest: d, chain: [3], changes: [[2, '5']] as Array<[number, string]> };
      const keys = [receipt('C'), counts.a, receipt('X')];
      expect(await fails(keys, chainsArgv(1, [{ ...good, digest: d.subarray(0, 15) }]))).to.match(/^TALLY_SCRIPT_ARGS the part at ARGV\[7\]/);
      expect(await fails(keys, chainsArgv(1, [{ ...good, chain: [9] }]))).to.match(/^TALLY_SCRIPT_ARGS ARGV\[10\] names no receipt/);
      expect(await fails(keys, chainsArgv(1, [{ ...good, changes: [[2, '1.5']] }]))).to.match(/^TALLY_SCRIPT_ARGS the change at ARGV\[12\]/);
      await redis.set(`${receipt('X')}~out`, 'hostile');
      expect(await fails(keys, chainsArgv(1, [good]))).to.match(/^TALLY_FOREIGN_RECEIPT .*~out holds a string, not a set/);
      await redis.del(`${receipt('X')}~out`);
      expect([await redis.exists(receipt('C'), receipt('X'), `${receipt('C')}~out`), ...(await read())], 'nothing written').to.deep.equal([0, null, null]);
      expect((await write(keys, chainsArgv(1, [good])))[0], 'the same write, well formed').to.equal(ScriptReply.WRITE_WRITTEN);
    });
  });
});
