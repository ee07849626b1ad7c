import { expect } from 'chai';
import type { PartChanges } from '@tally/shared';
import { aggregateNewParts, type Sum } from '../src/aggregate.js';

const MAX = Number.MAX_SAFE_INTEGER;
const all = () => true;

function entries(sums: Map<string, Sum>): Array<[string, Sum]> {
  return [...sums.entries()];
}

describe('aggregateNewParts', () => {
  it('returns an empty map for no parts, or only empty parts', () => {
    expect(aggregateNewParts([], all).size).to.equal(0);
    expect(aggregateNewParts([[], []], all).size).to.equal(0);
  });

  it('sums per SKU across parts', () => {
    const parts: PartChanges[] = [
      [
        ['a', 1],
        ['b', 2],
      ],
      [
        ['b', 3],
        ['c', -4],
      ],
      [
        ['a', 10],
        ['c', 4],
        ['d', 7],
      ],
    ];
    expect(entries(aggregateNewParts(parts, all))).to.deep.equal([
      ['a', 11],
      ['b', 5],
      ['c', 0],
      ['d', 7],
    ]);
  });

  it('keeps a SKU whose deltas cancel out, with 0', () => {
    const sums = aggregateNewParts([[['x', 5]], [['x', -5]]], all);
    expect(sums.has('x')).to.equal(true);
    expect(sums.get('x')).to.equal(0);
  });

  it('skips parts that are not new', () => {
    const parts: PartChanges[] = [
      [['a', 1]],
      [
        ['a', 100],
        ['b', 100],
      ],
      [['a', 2]],
      [['c', 1000]],
    ];
    const marked = new Set([1, 3]);
    const asked: number[] = [];
    const sums = aggregateNewParts(parts, (i) => {
      asked.push(i);
      return !marked.has(i);
    });
    expect(entries(sums)).to.deep.equal([['a', 3]]);
    expect(asked).to.deep.equal([0, 1, 2, 3]);
  });

  it('returns nothing when every part is marked', () => {
    expect(aggregateNewParts([[['a', 1]], [['b', 2]]], () => false).size).to.equal(0);
  });

  it('stays a number while the sum is a safe integer', () => {
    const sums = aggregateNewParts([[['a', MAX - 1]], [['a', 1]], [['b', -(MAX - 1)]], [['b', -1]]], all);
    expect(sums.get('a')).to.equal(MAX);
    expect(sums.get('b')).to.equal(-MAX);
    expect(typeof sums.get('a')).to.equal('number');
  });

  it('switches to bigint exactly past 2^53 (two parts of 2^53-1 for one SKU)', () => {
    const sums = aggregateNewParts([[['big', MAX]], [['big', MAX]]], all);
    const sum = sums.get('big');
    expect(typeof sum).to.equal('bigint');
    expect(sum).to.equal(2n * (2n ** 53n - 1n));
  });

  it('switches at the first unsafe sum: 2^53-1 plus 1 is 2^53n', () => {
    const sums = aggregateNewParts([[['a', MAX]], [['a', 1]]], all);
    expect(sums.get('a')).to.equal(2n ** 53n);
  });

  it('switches for negative sums too', () => {
    const sums = aggregateNewParts([[['a', -MAX]], [['a', -2]]], all);
    expect(sums.get('a')).to.equal(-(2n ** 53n) - 1n);
  });

  it('stays exact once bigint, for odd sums a double cannot hold', () => {
    const parts: PartChanges[] = [[['a', MAX]], [['a', MAX]], [['a', 3]], [['a', -MAX]], [['a', 1]]];
    const sum = aggregateNewParts(parts, all).get('a');
    expect(typeof sum).to.equal('bigint');
    expect(sum).to.equal(BigInt(MAX) + 4n);
  });

  it('matches a bigint model on random batches', () => {
    let seed = 99;
    const random = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed / 2 ** 32;
    };
    const bigDeltas = [MAX, -MAX, MAX - 1, 2 ** 52, -(2 ** 52), 1, -1, 0];
    for (let round = 0; round < 200; round++) {
      const parts: PartChanges[] = [];
      const newness: boolean[] = [];
      const model = new Map<string, bigint>();
      const partCount = 1 + Math.floor(random() * 12);
      for (let p = 0; p < partCount; p++) {
        const isNew = random() < 0.7;
        newness.push(isNew);
        const part: PartChanges = [];
        const used = new Set<string>();
        const size = Math.floor(random() * 5);
        for (let k = 0; k < size; k++) {
          const sku = `s${Math.floor(random() * 4)}`;
          if (used.has(sku)) continue; // SKUs are unique within a part
          used.add(sku);
          const delta = random() < 0.5 ? bigDeltas[Math.floor(random() * bigDeltas.length)]! : Math.floor(random() * 2001) - 1000;
          part.push([sku, delta]);
          if (isNew) model.set(sku, (model.get(sku) ?? 0n) + BigInt(delta));
        }
        parts.push(part);
      }
      const sums = aggregateNewParts(parts, (i) => newness[i]!);
      expect([...sums.keys()].sort()).to.deep.equal([...model.keys()].sort());
      for (const [sku, expected] of model) {
        const got = sums.get(sku)!;
        expect(BigInt(got), sku).to.equal(expected);
        if (typeof got === 'number') expect(Number.isSafeInteger(got)).to.equal(true);
      }
    }
  });
});
