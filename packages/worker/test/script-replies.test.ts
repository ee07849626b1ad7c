import { expect } from 'chai';
import { ScriptReply } from '@tally/shared';
import { ATOMIC_BATCH } from '../src/atomic-batch.js';
import { CLAIM_MARKERS, OCCUPY_MARKERS, WRITE_COUNTS } from '../src/two-step-batch.js';
import { TAKE_BACK_COUNTS } from '../src/cross-slot-counts.js';

/** The part of a script before its code: the header comment that is its contract. */
const header = (source: string): string => source.slice(0, source.indexOf(']]'));

describe('the scripts return codes as ScriptReply names them', () => {
  it('occupy_markers returns OCCUPY_NEEDS_DIGESTS and OCCUPY_RECEIPT_GONE, and its header documents both', () => {
    expect(OCCUPY_MARKERS.source).to.include(`return ${ScriptReply.OCCUPY_NEEDS_DIGESTS} end`);
    expect(OCCUPY_MARKERS.source).to.include(`then return ${ScriptReply.OCCUPY_RECEIPT_GONE} end`);
    expect(header(OCCUPY_MARKERS.source)).to.include(`${ScriptReply.OCCUPY_NEEDS_DIGESTS}: the batch is done in its bucket, and time`);
    expect(header(OCCUPY_MARKERS.source)).to.include(`${ScriptReply.OCCUPY_RECEIPT_GONE}: the receipt is gone`);
  });

  it("write_counts' outcomes are the four WRITE_* names, and its header gives the adopted flag its meaning", () => {
    expect(header(WRITE_COUNTS.source)).to.include(`'${ScriptReply.WRITE_PART_ADOPTED}'\n                    for an adopted one`);
    for (const outcome of [ScriptReply.WRITE_WRITTEN, ScriptReply.WRITE_RECEIPT, ScriptReply.WRITE_ISOLATE, ScriptReply.WRITE_FENCED]) {
      expect(WRITE_COUNTS.source).to.include(`{'${outcome}', `);
      expect(header(WRITE_COUNTS.source)).to.include(`'${outcome}'`);
    }
  });

  it("take_back_counts' outcomes are the four TAKE_BACK_* names", () => {
    for (const outcome of [ScriptReply.TAKE_BACK_TAKEN, ScriptReply.TAKE_BACK_RECEIPT, ScriptReply.TAKE_BACK_FOREIGN, ScriptReply.TAKE_BACK_ADOPTED]) {
      expect(TAKE_BACK_COUNTS.source).to.include(`{'${outcome}', `);
      expect(header(TAKE_BACK_COUNTS.source)).to.include(`'${outcome}'`);
    }
  });

  it("claim_markers' and atomic_batch's headers give each flag the meaning its name says", () => {
    const claim = header(CLAIM_MARKERS.source);
    expect(claim).to.include(`'${ScriptReply.CLAIM_NEW}' new`);
    expect(claim).to.include(`'${ScriptReply.CLAIM_DONE}' done`);
    expect(claim).to.match(new RegExp(`'${ScriptReply.CLAIM_HELD}' held`));
    const atomic = header(ATOMIC_BATCH.source);
    expect(atomic).to.include(`'${ScriptReply.ATOMIC_COUNTED}' counted now`);
    expect(atomic).to.include(`'${ScriptReply.ATOMIC_DUPLICATE}' a duplicate`);
    expect(atomic).to.include(`'${ScriptReply.ATOMIC_REFUSED}' refused by Redis`);
    expect(atomic).to.include(`replayed     ${ScriptReply.ATOMIC_REPLAYED} when the receipt answered`);
  });
});
