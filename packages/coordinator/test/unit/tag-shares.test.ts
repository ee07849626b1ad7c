import { expect } from 'chai';
import { TagShares } from '../../src/telemetry/tag-shares.js';

describe('TagShares (one channel of the exposure meter)', () => {
  it('adds shares per tag and takes them out by multiple-ack and single ack', () => {
    const shares = new TagShares();
    expect(shares.add(1, 0.5)).to.equal(true);
    shares.add(1, 0.5);
    shares.add(2, 0.25);
    shares.add(5, 1);
    expect(shares.size).to.equal(3);
    expect(shares.total()).to.equal(2.25);
    expect(shares.ackOne(5)).to.equal(1);
    expect(shares.ackOne(5), 'taken once').to.equal(0);
    expect(shares.ackThrough(2)).to.equal(1.25);
    expect(shares.size).to.equal(0);
    expect(shares.add(2, 1), 'an acked tag takes nothing').to.equal(false);
    expect(shares.ackOne(1)).to.equal(0);
  });

  it('matches a Map over random tags, acks and a range far past its first slots', () => {
    let seed = 7;
    const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const shares = new TagShares();
    const model = new Map<number, number>();
    let ackedThrough = 0;
    let next = 1;
    for (let step = 0; step < 60_000; step++) {
      const roll = random();
      if (roll < 0.6) {
        const tag = ackedThrough + 1 + Math.floor(random() * Math.max(1, next - ackedThrough + 20_000 * (roll < 0.01 ? 1 : 0)));
        next = Math.max(next, tag + 1);
        shares.add(tag, 0.25);
        model.set(tag, (model.get(tag) ?? 0) + 0.25);
      } else if (roll < 0.8) {
        const tag = ackedThrough + 1 + Math.floor(random() * Math.max(1, next - ackedThrough));
        expect(shares.ackOne(tag)).to.equal(model.get(tag) ?? 0);
        model.delete(tag);
      } else {
        const upTo = ackedThrough + Math.floor(random() * 50);
        let expected = 0;
        for (const [tag, share] of model) if (tag <= upTo) ((expected += share), model.delete(tag));
        expect(shares.ackThrough(upTo)).to.be.closeTo(expected, 1e-9);
        ackedThrough = Math.max(ackedThrough, upTo);
      }
      expect(shares.size).to.equal(model.size);
    }
    expect(shares.total()).to.be.closeTo(
      [...model.values()].reduce((a, b) => a + b, 0),
      1e-9,
    );
  });
});
