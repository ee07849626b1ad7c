import { expect } from 'chai';
import { PART_DONE, PART_NEW, shardOf } from '@tally/shared';
import { groupByCountShard } from '../src/cross-slot-counts.js';

describe('cross-slot counts: grouping a message-scoped batch by count shard (pure)', () => {
  const SHARDS = 16;
  const changes: Array<Array<[string, number]>> = [
    [
      ['A', 1],
      ['B', 2],
      ['C', 3],
    ],
    [
      ['A', 10],
      ['D', -4],
    ],
    [['B', 100]],
  ];

  it("sums each new part's changes into its SKU's own shard, and names the parts each shard got", () => {
    const groups = groupByCountShard(changes, Uint8Array.of(PART_NEW, PART_NEW, PART_NEW), SHARDS);
    const byShard = new Map(groups.map((g) => [g.shard, g]));
    const sums = new Map<string, number>();
    for (const group of groups) {
      for (const [sku, sum] of group.sums) {
        expect(shardOf(sku, SHARDS), `${sku} written on its own shard`).to.equal(group.shard);
        sums.set(sku, Number(sum));
      }
    }
    expect(Object.fromEntries(sums)).to.deep.equal({ A: 11, B: 102, C: 3, D: -4 });
    expect(byShard.get(shardOf('A', SHARDS))!.parts).to.include.members([0, 1]);
    expect(byShard.get(shardOf('D', SHARDS))!.parts).to.include(1);
    expect(byShard.get(shardOf('C', SHARDS))!.parts).to.include(0);
  });

  it('leaves out parts that are not new (duplicates and held parts write nothing)', () => {
    const groups = groupByCountShard(changes, Uint8Array.of(PART_DONE, PART_NEW, PART_DONE), SHARDS);
    const all = new Map(groups.flatMap((g) => [...g.sums]));
    expect(Object.fromEntries([...all].map(([k, v]) => [k, Number(v)]))).to.deep.equal({ A: 10, D: -4 });
    for (const group of groups) expect(group.parts).to.deep.equal([1]);
  });
});
