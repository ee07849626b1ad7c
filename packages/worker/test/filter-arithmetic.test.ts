/**
 * The marker filter's arithmetic, in Lua (marker_buckets.lua: openBucket,
 * addToFilter, mayHold) and in TypeScript (shared/src/markers.ts
 * filterSlotOf, which tools such as the bench's marker fill use to lay
 * filters out), must agree bit for bit: a tool that sets fewer bits than the
 * scripts check, or a script that sets fewer than it checks, makes a written
 * digest read as new, and its redelivery is counted twice.
 *
 * A subset check ("the bits filterSlotOf names are set") passes when either
 * side sets too few, so these tests compare the exact set of bits: the
 * filter the script leaves is read back whole and must equal, byte for byte,
 * the union of filterSlotOf over the digests written. Then the invariant
 * itself as a property: every digest written may be held, by the script's
 * own check and by filterSlotOf's.
 *
 * The helpers run as they are, pasted into a small script of the test's own
 * by the loader's @include (Redis scripts cannot call one another), against a
 * private redis-server.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { expect } from 'chai';
import type { Redis } from 'ioredis';
import { filterBlocksFor, filterSlotOf, markerFilterBits } from '@tally/shared';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import { expandIncludes } from '../src/lua-scripts.js';

/**
 * KEYS[1] a marker base; ARGV[1] what to do; ARGV[2] filter bits per
 * expected marker; ARGV[3] the bucket; ARGV[4] sub-buckets for openBucket;
 * ARGV[5..] 16-byte digests.
 *   add    opens the bucket, adds the digests to its filter, returns the filter
 *   check  mayHold then addToFilter in one run, as the marker scripts do (the
 *          words mayHold read are reused), returns the filter
 *   hold   returns the digests mayHold keeps
 */
const HARNESS = `
local base = KEYS[1]
local action = ARGV[1]
local filterBits = tonumber(ARGV[2])
local bucket = tonumber(ARGV[3])
local initialSubs = tonumber(ARGV[4])
local digests = {}
for i = 5, #ARGV do digests[#digests + 1] = ARGV[i] end

-- @include marker_buckets

local filter = base .. ':' .. bucket .. ':f'
if action == 'hold' then return mayHold(bucket, digests) end
openBucket(bucket, initialSubs, tonumber(redis.call('TIME')[1]) + 600)
if action == 'check' then mayHold(bucket, digests) end
addToFilter(bucket, digests)
return redis.call('GET', filter)
`;

function readInclude(name: string): string {
  // The build copies src/lua beside the compiled sources: dist/test -> dist/src/lua.
  return readFileSync(new URL(`../src/lua/include/${name}.lua`, import.meta.url), 'utf8');
}

const SCRIPT = expandIncludes(HARNESS, readInclude);
const FILTER_BITS = markerFilterBits('message');

/** The filter filterSlotOf describes for these digests: the union of their bits, block by block, big-endian words. */
function expectedFilter(digests: readonly Buffer[], blocks: number): Buffer {
  const filter = Buffer.alloc(blocks * 4);
  for (const digest of digests) {
    const { block, bits } = filterSlotOf(digest, blocks);
    filter.writeUInt32BE((filter.readUInt32BE(block * 4) | bits) >>> 0, block * 4);
  }
  return filter;
}

/** The bit positions (block*32 + bit, bit 0 the lowest of the word) set in a filter. */
function bitPositions(filter: Buffer): number[] {
  const positions: number[] = [];
  for (let block = 0; block < filter.length / 4; block++) {
    const word = filter.readUInt32BE(block * 4);
    for (let bit = 0; bit < 32; bit++) if ((word >>> bit) & 1) positions.push(block * 32 + bit);
  }
  return positions;
}

/** A readable difference: the positions one side set and the other did not (empty arrays when they agree). */
function difference(actual: Buffer, expected: Buffer): { scriptOnly: number[]; filterSlotOfOnly: number[] } {
  const a = new Set(bitPositions(actual));
  const e = new Set(bitPositions(expected));
  return {
    scriptOnly: [...a].filter((p) => !e.has(p)).slice(0, 10),
    filterSlotOfOnly: [...e].filter((p) => !a.has(p)).slice(0, 10),
  };
}

/** Marker digests are 16 bytes (markers.ts MARKER_DIGEST_BYTES). */
function randomDigests(count: number): Buffer[] {
  return Array.from({ length: count }, () => randomBytes(16));
}

describe('marker filter arithmetic: Lua and filterSlotOf agree bit for bit (a private Redis)', function () {
  this.timeout(60_000);
  let server: PrivateRedis;
  let redis: Redis;
  let n = 0;
  /** A marker base of its own for every call: a fresh bucket, a fresh filter. */
  const freshBase = () => `t.filterbits.${process.pid}.${++n}:mk:{3}`;

  async function run(action: 'add' | 'check' | 'hold', base: string, subs: number, digests: readonly Buffer[]): Promise<Buffer | Buffer[]> {
    const bucket = 7;
    return (await redis.callBuffer('EVAL', SCRIPT, 1, base, action, FILTER_BITS, bucket, subs, ...digests)) as Buffer | Buffer[];
  }

  async function blocksOf(base: string): Promise<number> {
    return Number(await redis.hget(`${base}:7:m`, 'f'));
  }

  before(async () => {
    server = await startPrivateRedis();
    redis = server.admin();
  });
  after(async () => {
    redis?.disconnect();
    await server?.stop();
  });

  // Sparse (256 initial sub-buckets: 12,288 blocks) and dense (1: the 64-block minimum, where blocks are shared):
  // a bit missing on either side shows in the first; merging bits of one block, in the second.
  for (const [label, subs, count] of [
    ['sparse', 256, 400],
    ['dense, blocks shared by many digests', 1, 300],
    ['more digests than one chunk of 1,000', 256, 2_500],
  ] as const) {
    for (const action of ['add', 'check'] as const) {
      it(`${label} (${action === 'add' ? 'addToFilter alone' : 'after mayHold, as the scripts run it'}): the filter holds exactly the bits filterSlotOf names`, async () => {
        for (let round = 0; round < 5; round++) {
          const base = freshBase();
          const digests = randomDigests(count);
          const filter = (await run(action, base, subs, digests)) as Buffer;
          const blocks = await blocksOf(base);
          expect(blocks, 'sized as filterBlocksFor sizes it').to.equal(filterBlocksFor(subs * 64, FILTER_BITS));
          expect(filter.length).to.equal(blocks * 4);
          const expected = expectedFilter(digests, blocks);
          expect(difference(filter, expected), 'bits set by only one side').to.deep.equal({ scriptOnly: [], filterSlotOfOnly: [] });
          expect(filter.equals(expected)).to.equal(true);
        }
      });
    }
  }

  it('names four bits for a digest whose four bytes differ mod 32, one word per block, as the scripts do', async () => {
    // Bytes 9..12 are 0, 1, 2, 31 (mod 32): bits 0, 1, 2 and 31 of its block's word.
    const digest = Buffer.from('00000000' + '00000005' + '000122ff' + '00000000', 'hex');
    const base = freshBase();
    const filter = (await run('add', base, 1, [digest])) as Buffer;
    const blocks = await blocksOf(base);
    expect(filterSlotOf(digest, blocks)).to.deep.equal({ block: 5 % blocks, bits: 0x80000007 });
    expect(bitPositions(filter)).to.deep.equal([5 * 32, 5 * 32 + 1, 5 * 32 + 2, 5 * 32 + 31]);
  });

  it('property: random digests written in several batches all "may hold", by the script and by filterSlotOf', async () => {
    for (let round = 0; round < 20; round++) {
      const base = freshBase();
      const subs = round % 2 === 0 ? 1 : 64;
      const batches = Array.from({ length: 1 + (round % 4) }, () => randomDigests(1 + Math.floor(Math.random() * 700)));
      for (const batch of batches) await run(round % 3 === 0 ? 'add' : 'check', base, subs, batch);
      const written = batches.flat();
      const held = (await run('hold', base, subs, written)) as Buffer[];
      const missed = written.filter((digest) => !held.some((h) => h.equals(digest)));
      expect(
        missed.map((d) => d.toString('hex')),
        'written digests the script reads as new',
      ).to.deep.equal([]);
      const filter = (await redis.getBuffer(`${base}:7:f`))!;
      const blocks = await blocksOf(base);
      for (const digest of written) {
        const { block, bits } = filterSlotOf(digest, blocks);
        expect((filter.readUInt32BE(block * 4) & bits) >>> 0, digest.toString('hex')).to.equal(bits);
      }
      if (subs > 1) {
        // And a sparse filter still says "new" for digests never written: it filters, it does not answer "may hold" to all.
        const strangers = randomDigests(200);
        const heldStrangers = (await run('hold', base, subs, strangers)) as Buffer[];
        expect(heldStrangers.length, 'strangers the filter may hold').to.be.below(20);
      }
    }
  });
});
