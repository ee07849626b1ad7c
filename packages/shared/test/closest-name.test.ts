import { expect } from 'chai';
import { closestName, editDistance } from '../src/closest-name.js';

describe('editDistance', () => {
  it('counts insertions, deletions and substitutions', () => {
    expect(editDistance('', '')).to.equal(0);
    expect(editDistance('MODE', 'MODE')).to.equal(0);
    expect(editDistance('', 'MODE')).to.equal(4);
    expect(editDistance('MODE', '')).to.equal(4);
    expect(editDistance('MODEE', 'MODE')).to.equal(1);
    expect(editDistance('MDE', 'MODE')).to.equal(1);
    expect(editDistance('MODA', 'MODE')).to.equal(1);
    expect(editDistance('kitten', 'sitting')).to.equal(3);
    expect(editDistance('PREFETCH', 'PREFIX')).to.equal(4);
  });

  it('counts a swap of two neighbouring letters as one edit', () => {
    expect(editDistance('MDOE', 'MODE')).to.equal(1);
    expect(editDistance('WROKERS', 'WORKERS')).to.equal(1);
    expect(editDistance('ab', 'ba')).to.equal(1);
    // Optimal string alignment: a swapped pair is not edited again.
    expect(editDistance('CA', 'ABC')).to.equal(3);
  });

  it('is symmetric', () => {
    const words = ['', 'A', 'MODE', 'MDOE', 'MODEE', 'QUEUE_TYPE', 'QUEUE', 'BATCH_SIZE', 'BATCHSIZE'];
    for (const a of words) for (const b of words) expect(editDistance(a, b), `${a} ${b}`).to.equal(editDistance(b, a));
  });
});

describe('closestName', () => {
  const names = ['MODE', 'QUEUE', 'QUEUE_TYPE', 'PREFIX', 'PREFETCH'];

  it('picks the nearest candidate, ignoring case', () => {
    expect(closestName('MODEE', names)).to.deep.equal({ name: 'MODE', distance: 1, close: true });
    expect(closestName('queue_typ', names)).to.deep.equal({ name: 'QUEUE_TYPE', distance: 1, close: true });
    expect(closestName('PREFX', names)).to.include({ name: 'PREFIX', distance: 1 });
    expect(closestName('PREFETC', names)).to.include({ name: 'PREFETCH', distance: 1 });
  });

  it('keeps the first candidate on a tie', () => {
    expect(closestName('AB', ['AC', 'AD'])!.name).to.equal('AC');
    expect(closestName('AB', ['AD', 'AC'])!.name).to.equal('AD');
  });

  it('calls a match close within 2 edits, or a third of a long name', () => {
    expect(closestName('MXDX', names)).to.include({ name: 'MODE', distance: 2, close: true });
    expect(closestName('FOO', names)!.close).to.equal(false);
    expect(closestName('XXXXXXXXXXXX', ['XXXXXXXXXYYY'])).to.include({ distance: 3, close: true });
    expect(closestName('XXXXXXXXXXXX', ['XXXXXXXXYYYY'])).to.include({ distance: 4, close: true });
    expect(closestName('XXXXXXXXXXXX', ['XXXXXXXYYYYY'])).to.include({ distance: 5, close: false });
  });

  it('is null without candidates', () => {
    expect(closestName('MODE', [])).to.equal(null);
  });
});
