import { expect } from 'chai';
import type { Change } from '../src/message.js';
import { fnv1a32, ownerOf, SHARD_HASH, shardOf, splitByShard } from '../src/shards.js';

/** Reference FNV-1a 32 over bytes, written independently of the code under test. */
function fnv1a32Bytes(bytes: Uint8Array): number {
  let hash = 0x811c9dc5;
  for (const byte of bytes) {
    hash = (hash ^ byte) >>> 0;
    // 32-bit multiply by the FNV prime 16777619 without losing precision.
    hash = (hash * 0x193 + ((hash << 24) >>> 0)) >>> 0;
  }
  return hash >>> 0;
}

function referenceHash(text: string): number {
  return fnv1a32Bytes(Buffer.from(text, 'utf8'));
}

/** Seeded PRNG (mulberry32) so a failing case can be replayed. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function int(random: () => number, lo: number, hi: number): number {
  return lo + Math.floor(random() * (hi - lo + 1));
}

/**
 * Random strings mixing every UTF-8 length class, emoji (surrogate pairs),
 * lone low surrogates anywhere and lone high surrogates at the end of the
 * string. A lone high surrogate followed by another character ('a\ud800b') is
 * left out on purpose: fnv1a32 currently hashes it as the 3 bytes of the
 * surrogate itself instead of U+FFFD (reported as a bug, src not changed
 * here). Once fixed, drop the "last" restriction below.
 */
function randomSku(random: () => number): string {
  const length = int(random, 1, 24);
  let out = '';
  for (let i = 0; i < length; i++) {
    const kind = int(random, 0, 7);
    switch (kind) {
      case 0:
      case 1:
        out += String.fromCharCode(int(random, 0x20, 0x7e)); // ASCII
        break;
      case 2:
        out += String.fromCharCode(int(random, 0x80, 0x7ff)); // 2-byte
        break;
      case 3:
        out += String.fromCharCode(int(random, 0x800, 0xd7ff)); // 3-byte below the surrogates
        break;
      case 4:
        out += String.fromCharCode(int(random, 0xe000, 0xffff)); // 3-byte above the surrogates
        break;
      case 5:
        out += String.fromCodePoint(int(random, 0x10000, 0x10ffff)); // 4-byte: a surrogate pair
        break;
      case 6:
        out += String.fromCodePoint(int(random, 0x1f300, 0x1faff)); // emoji
        break;
      case 7:
        out += String.fromCharCode(int(random, 0xdc00, 0xdfff)); // lone low surrogate
        break;
    }
  }
  if (random() < 0.15) out += String.fromCharCode(int(random, 0xd800, 0xdbff)); // lone high surrogate, last
  if (random() < 0.15) out = String.fromCharCode(int(random, 0xd800, 0xdbff)) + out; // lone high surrogate, first
  return out;
}

describe('fnv1a32', () => {
  it('names its hash for the layout record', () => {
    expect(SHARD_HASH).to.equal('fnv1a32-utf8');
  });

  it('matches the published FNV-1a 32 test vectors', () => {
    expect(fnv1a32('')).to.equal(0x811c9dc5);
    expect(fnv1a32('a')).to.equal(0xe40c292c);
    expect(fnv1a32('foobar')).to.equal(0xbf9cf968);
    // And the reference implementation of this file agrees with them.
    expect(referenceHash('')).to.equal(0x811c9dc5);
    expect(referenceHash('a')).to.equal(0xe40c292c);
    expect(referenceHash('foobar')).to.equal(0xbf9cf968);
  });

  it('returns an unsigned 32-bit integer', () => {
    for (const sku of ['', 'a', 'foobar', 'SKU-000001', '😀', 'x'.repeat(1000)]) {
      const hash = fnv1a32(sku);
      expect(Number.isInteger(hash)).to.equal(true);
      expect(hash).to.be.within(0, 0xffffffff);
    }
  });

  it('hashes the UTF-8 bytes of fixed non-ASCII SKUs', () => {
    const skus = ['é', 'café', '€', '商品', '😀', 'a😀b', '\u{10ffff}', '\u{10000}', '\u07ff', '\u0800', '\uffff', '\ue000', '\ud7ff'];
    for (const sku of skus) expect(fnv1a32(sku), JSON.stringify(sku)).to.equal(referenceHash(sku));
  });

  it('hashes a lone high surrogate followed by a character as U+FFFD (regression)', () => {
    for (const sku of ['\ud800a', 'a\ud800b', '\ud800\ud800\udc00', 'x\udbffy']) {
      expect(fnv1a32(sku), JSON.stringify(sku)).to.equal(referenceHash(sku));
    }
  });

  it('encodes lone surrogates as U+FFFD, as Buffer.from does', () => {
    const fffd = referenceHash('\ufffd');
    expect(fnv1a32('\udc00')).to.equal(fffd);
    expect(fnv1a32('\udfff')).to.equal(fffd);
    expect(fnv1a32('\ud800')).to.equal(fffd);
    expect(fnv1a32('\udbff')).to.equal(fffd);
    const equivalents: Array<[string, string]> = [
      ['a\udc00', 'a\ufffd'],
      ['\udc00a', '\ufffda'],
      ['a\udc00\udc00b', 'a\ufffd\ufffdb'],
      ['😀\udc00', '😀\ufffd'],
      ['x\ud800', 'x\ufffd'],
      ['\udc00\ud800', '\ufffd\ufffd'],
    ];
    for (const [sku, same] of equivalents) {
      expect(Buffer.from(sku, 'utf8').equals(Buffer.from(same, 'utf8')), 'premise').to.equal(true);
      expect(fnv1a32(sku), JSON.stringify(sku)).to.equal(referenceHash(same));
    }
  });

  it('hashes 20k random strings (all UTF-8 lengths, emoji, lone surrogates) like FNV-1a over Buffer.from(sku, "utf8")', () => {
    const random = mulberry32(20240601);
    for (let n = 0; n < 20_000; n++) {
      const sku = randomSku(random);
      const expected = referenceHash(sku);
      if (fnv1a32(sku) !== expected) {
        expect.fail(`fnv1a32(${JSON.stringify(sku)}) = ${fnv1a32(sku).toString(16)}, FNV-1a of its UTF-8 bytes is ${expected.toString(16)}`);
      }
    }
  });
});

describe('shardOf and ownerOf', () => {
  const VIRTUAL_SHARDS = 16;
  const skus = Array.from({ length: 10_000 }, (_, i) => `SKU-${i.toString(36)}-${(i * 7919) % 1000}`);

  it('is fnv1a32(sku) % virtualShards, within range', () => {
    for (const sku of skus.slice(0, 1000)) {
      const shard = shardOf(sku, VIRTUAL_SHARDS);
      expect(shard).to.equal(referenceHash(sku) % VIRTUAL_SHARDS);
      expect(shard).to.be.within(0, VIRTUAL_SHARDS - 1);
    }
  });

  it('keeps known shards (a changed hash would move every stored count)', () => {
    expect(shardOf('foobar', 16)).to.equal(0xbf9cf968 % 16);
    expect(shardOf('a', 16)).to.equal(0xe40c292c % 16);
    expect(shardOf('', 16)).to.equal(0x811c9dc5 % 16);
    expect(shardOf('a', 1)).to.equal(0);
    expect(shardOf('foobar', 1024)).to.equal(0xbf9cf968 % 1024);
  });

  it('gives the same shard when recomputed, and depends only on the SKU and the virtual shard count', () => {
    const first = skus.map((sku) => shardOf(sku, VIRTUAL_SHARDS));
    const second = skus.map((sku) => shardOf(sku, VIRTUAL_SHARDS));
    expect(second).to.deep.equal(first);
    // shardOf takes no worker count: nothing about threads can move a SKU.
    expect(shardOf.length).to.equal(2);
    for (let workers = 1; workers <= 8; workers++) {
      const owners = first.map((shard) => ownerOf(shard, workers));
      // Recomputed after "changing" the number of workers: identical shards.
      expect(skus.map((sku) => shardOf(sku, VIRTUAL_SHARDS))).to.deep.equal(first);
      // The shards each worker serves, enumerated independently of the SKUs.
      const owned = new Map<number, Set<number>>();
      for (let v = 0; v < VIRTUAL_SHARDS; v++) {
        const owner = ownerOf(v, workers);
        if (!owned.has(owner)) owned.set(owner, new Set());
        owned.get(owner)!.add(v);
      }
      for (let i = 0; i < skus.length; i++) {
        const owner = owners[i]!;
        if (!(owner >= 0 && owner < workers) || !owned.get(owner)?.has(first[i]!)) {
          expect.fail(`workers=${workers}: ${skus[i]} in shard ${first[i]} got owner ${owner}, which does not serve that shard`);
        }
      }
    }
  });

  it('changes owners (not shards) when the number of workers changes', () => {
    const shards = skus.map((sku) => shardOf(sku, VIRTUAL_SHARDS));
    const ownersWith2 = shards.map((s) => ownerOf(s, 2));
    const ownersWith3 = shards.map((s) => ownerOf(s, 3));
    expect(ownersWith3).not.to.deep.equal(ownersWith2);
    expect(skus.map((sku) => shardOf(sku, VIRTUAL_SHARDS))).to.deep.equal(shards);
  });

  it('gives every worker a disjoint set of shards that together cover all of them', () => {
    for (let workers = 1; workers <= 8; workers++) {
      const seen = new Map<number, number>();
      for (let v = 0; v < VIRTUAL_SHARDS; v++) seen.set(v, ownerOf(v, workers));
      expect(seen.size).to.equal(VIRTUAL_SHARDS);
      expect(new Set(seen.values()).size).to.equal(workers);
    }
  });

  it('spreads SKUs over the virtual shards', () => {
    const counts = new Array<number>(VIRTUAL_SHARDS).fill(0);
    for (const sku of skus) counts[shardOf(sku, VIRTUAL_SHARDS)]!++;
    const mean = skus.length / VIRTUAL_SHARDS;
    for (const count of counts) expect(count).to.be.within(mean * 0.8, mean * 1.2);
  });
});

describe('splitByShard', () => {
  const V = 16;

  function flatten(parts: Map<number, Array<[string, number]>>): Map<string, number> {
    const out = new Map<string, number>();
    for (const part of parts.values()) for (const [sku, delta] of part) out.set(sku, delta);
    return out;
  }

  it('keys every part by the shard of its SKUs', () => {
    const changes: Change[] = Array.from({ length: 500 }, (_, i) => ({ sku: `sku-${i}`, delta: i + 1 }));
    const parts = splitByShard(changes, V, null);
    let total = 0;
    for (const [vshard, part] of parts) {
      expect(vshard).to.be.within(0, V - 1);
      expect(part.length).to.be.greaterThan(0);
      for (const [sku] of part) expect(shardOf(sku, V)).to.equal(vshard);
      total += part.length;
    }
    expect(total).to.equal(500);
    expect(flatten(parts).get('sku-41')).to.equal(42);
  });

  it('skips zero deltas and leaves no empty part behind', () => {
    const parts = splitByShard(
      [
        { sku: 'a', delta: 0 },
        { sku: 'b', delta: 0 },
      ],
      V,
      null,
    );
    expect(parts.size).to.equal(0);
    const mixed = splitByShard(
      [
        { sku: 'a', delta: 0 },
        { sku: 'b', delta: 3 },
      ],
      V,
      null,
    );
    expect([...mixed.entries()]).to.deep.equal([[shardOf('b', V), [['b', 3]]]]);
  });

  it('sums repeated SKUs into one entry, keeping first-seen order', () => {
    const skus = ['x1', 'x2', 'x3', 'x4', 'x5', 'x6', 'x7', 'x8'];
    const changes: Change[] = [];
    for (let round = 0; round < 3; round++) for (const sku of skus) changes.push({ sku, delta: round + 1 });
    const parts = splitByShard(changes, 1, null);
    expect([...parts.keys()]).to.deep.equal([0]);
    expect(parts.get(0)).to.deep.equal(skus.map((sku) => [sku, 6]));
  });

  it('keeps a SKU whose deltas cancel out in its part with delta 0', () => {
    const parts = splitByShard(
      [
        { sku: 'gone', delta: 5 },
        { sku: 'gone', delta: -2 },
        { sku: 'gone', delta: -3 },
      ],
      V,
      null,
    );
    expect([...parts.entries()]).to.deep.equal([[shardOf('gone', V), [['gone', 0]]]]);
  });

  it('sums only the non-zero, accepted changes of a SKU', () => {
    const accept = new Set(['sale']);
    const parts = splitByShard(
      [
        { sku: 'a', delta: 4, type: 'sale' },
        { sku: 'a', delta: 100, type: 'audit' },
        { sku: 'a', delta: 0, type: 'sale' },
        { sku: 'a', delta: -1, type: 'sale' },
        { sku: 'a', delta: 7 },
      ],
      V,
      accept,
    );
    expect(flatten(parts)).to.deep.equal(new Map([['a', 3]]));
  });

  it('filters by acceptTypes: untyped changes are rejected when a filter is set', () => {
    const changes: Change[] = [
      { sku: 'sold', delta: -1, type: 'sale' },
      { sku: 'back', delta: 1, type: 'return' },
      { sku: 'audited', delta: 9, type: 'audit' },
      { sku: 'untyped', delta: 2 },
      { sku: 'Sale-case', delta: 2, type: 'Sale' },
    ];
    const filtered = flatten(splitByShard(changes, V, new Set(['sale', 'return'])));
    expect(filtered).to.deep.equal(
      new Map([
        ['sold', -1],
        ['back', 1],
      ]),
    );
  });

  it('accepts every change, typed or not, when acceptTypes is null', () => {
    const changes: Change[] = [
      { sku: 'sold', delta: -1, type: 'sale' },
      { sku: 'audited', delta: 9, type: 'audit' },
      { sku: 'untyped', delta: 2 },
    ];
    expect(flatten(splitByShard(changes, V, null))).to.deep.equal(
      new Map([
        ['sold', -1],
        ['audited', 9],
        ['untyped', 2],
      ]),
    );
  });

  it('returns no parts when a filter accepts none of the types', () => {
    expect(
      splitByShard(
        [
          { sku: 'a', delta: 1, type: 'x' },
          { sku: 'b', delta: 1 },
        ],
        V,
        new Set(['y']),
      ).size,
    ).to.equal(0);
  });

  it('agrees with a straightforward model on random messages', () => {
    const random = mulberry32(7);
    const types = ['sale', 'return', 'audit', undefined];
    for (let n = 0; n < 300; n++) {
      const changes: Change[] = [];
      const count = int(random, 0, 40);
      for (let i = 0; i < count; i++) {
        const type = types[int(random, 0, types.length - 1)];
        const change = { sku: `s${int(random, 0, 12)}`, delta: int(random, -3, 3) };
        changes.push(type === undefined ? change : { ...change, type });
      }
      const accept = random() < 0.5 ? null : new Set(['sale', 'return']);
      const model = new Map<string, number>();
      for (const c of changes) {
        if (c.delta === 0) continue;
        if (accept !== null && (c.type === undefined || !accept.has(c.type))) continue;
        model.set(c.sku, (model.get(c.sku) ?? 0) + c.delta);
      }
      const parts = splitByShard(changes, V, accept);
      expect(flatten(parts)).to.deep.equal(model);
      for (const [vshard, part] of parts) {
        expect(new Set(part.map(([sku]) => sku)).size, 'SKUs unique within a part').to.equal(part.length);
        for (const [sku] of part) expect(shardOf(sku, V)).to.equal(vshard);
      }
    }
  });
});
