import { expect } from 'chai';
import { compareWithTruth, describeTruthCheck } from '../src/truth.js';

describe('compareWithTruth', () => {
  const truth = new Map([
    ['A', 3],
    ['B', 2],
  ]);

  it('is exact only when every SKU matches', () => {
    expect(
      compareWithTruth(
        new Map([
          ['A', 3],
          ['B', 2],
        ]),
        truth,
      ),
    ).to.deep.include({ exact: true, skus: 2, below: [], missingUnits: 0, excessUnits: 0 });
  });

  it('finds losses and overcounts both ways, a SKU missing on either side counting as 0', () => {
    const counts = new Map([
      ['A', 5],
      ['C', 1],
    ]);
    const check = compareWithTruth(counts, truth);
    expect(check.exact).to.equal(false);
    expect(check.skus).to.equal(3);
    expect(check.below).to.deep.equal(['B']);
    expect(check.missingUnits).to.equal(2);
    expect([...check.excess]).to.deep.equal([
      ['A', 2],
      ['C', 1],
    ]);
    expect(check.excessUnits).to.equal(3);
    expect(describeTruthCheck(check, counts, truth)).to.equal('1 SKU(s) below the truth (2 units), 2 above (3 units); e.g. B 0 != 2, A 5 != 3, C 1 != 0');
  });

  it('reads the raw integer strings `tally counts` keeps', () => {
    expect(
      compareWithTruth(
        new Map([
          ['A', '3'],
          ['B', '1'],
        ]),
        truth,
      ),
    ).to.deep.include({ exact: false, below: ['B'], missingUnits: 1 });
  });
});
