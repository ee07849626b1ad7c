import { expect } from 'chai';
import { loadConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';
import { assignPartitions, partitionQueue, partitionQueues, partitionsOf, partitionShare } from '../src/partitions.js';

const ids = (n: number) => Array.from({ length: n }, (_, i) => `vm-${i}:${1000 + i}:${(i * 2654435761) >>> 0}`);

describe('partitions', () => {
  it('names one queue TALLY_QUEUE and N queues <queue>.<p>', () => {
    expect(partitionQueue('inv', 1, 0)).to.equal('inv');
    expect(partitionQueues('inv', 3)).to.deep.equal(['inv.0', 'inv.1', 'inv.2']);
  });

  it('TALLY_PARTITIONS defaults to 1 and is validated, the error naming the variable', () => {
    expect(loadConfig({}).partitions).to.equal(1);
    expect(loadConfig({ TALLY_PARTITIONS: '8' }).partitions).to.equal(8);
    for (const bad of ['0', '1025', 'x', '2.5']) {
      expect(() => loadConfig({ TALLY_PARTITIONS: bad }))
        .to.throw(ConfigError)
        .with.property('variable', 'TALLY_PARTITIONS');
    }
  });

  it('gives every partition exactly one owner, each daemon ⌊N/D⌋ or ⌈N/D⌉', () => {
    for (const n of [1, 2, 3, 7, 8, 16, 64, 1024]) {
      for (const d of [1, 2, 3, 4, 5, 9, 70]) {
        const live = ids(d);
        const owners = assignPartitions(n, live);
        expect(owners).to.have.length(n);
        const held = new Map(live.map((id) => [id, 0]));
        for (const owner of owners) held.set(owner, held.get(owner)! + 1);
        for (const count of held.values()) expect(count).to.be.within(Math.floor(n / d), Math.ceil(n / d));
        expect([...held.values()].reduce((a, b) => a + b, 0)).to.equal(n);
      }
    }
  });

  it('depends on the set of ids only, not their order or repeats', () => {
    const live = ids(5);
    const a = assignPartitions(16, live);
    const b = assignPartitions(16, [...live].reverse().concat(live[0]!));
    expect(b).to.deep.equal(a);
  });

  it('partitionsOf: what each daemon computes for itself covers the partitions once', () => {
    const live = ids(3);
    const all = live.flatMap((self) => partitionsOf(8, live, self)).sort((x, y) => x - y);
    expect(all).to.deep.equal([0, 1, 2, 3, 4, 5, 6, 7]);
    // A daemon not yet listed (its first beat not seen) counts itself in.
    expect(partitionsOf(8, [], 'solo')).to.deep.equal([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it('moves fewer partitions than a reshuffle when a daemon joins or leaves', () => {
    const moved = (a: string[], b: string[]) => a.filter((owner, p) => owner !== b[p]).length;
    const n = 64;
    let total = 0;
    let modulo = 0;
    for (let d = 2; d <= 8; d++) {
      const before = ids(d);
      const after = ids(d + 1);
      total += moved(assignPartitions(n, before), assignPartitions(n, after));
      const mod = (live: string[]) => Array.from({ length: n }, (_, p) => [...live].sort()[p % live.length]!);
      modulo += moved(mod(before), mod(after));
    }
    // The ideal is n/(d+1) per join (the newcomer's share): 64/3+…+64/9 ≈ 81 over these seven joins.
    expect(total).to.be.below(modulo);
    expect(total).to.be.below(2.5 * 81);
  });

  it('partitionShare splits N over D with the remainder on the first ones', () => {
    expect([0, 1, 2].map((i) => partitionShare(8, 3, i))).to.deep.equal([3, 3, 2]);
    expect(partitionShare(2, 3, 2)).to.equal(0);
  });
});
