import { expect } from 'chai';
import { progressLine, PublishProgress } from '../../src/commands/publish-progress.js';

describe('tally publish progress (pure)', () => {
  it('shows nothing during the first two seconds, then redraws one line at most every 250 ms, and clears it at the end', () => {
    let now = 0;
    const writes: string[] = [];
    const progress = new PublishProgress(
      10_000,
      (text) => writes.push(text),
      () => now,
    );
    now = 1_900;
    progress.update(3_000);
    expect(writes, 'a short run shows nothing').to.deep.equal([]);
    now = 2_000;
    progress.update(4_000);
    now = 2_100;
    progress.update(4_500);
    now = 2_300;
    progress.update(5_000);
    expect(writes).to.have.length(2);
    expect(writes[0]).to.equal('\r\x1b[Kpublished 4,000 of 10,000 (40%), 2,000 msg/s, about 3 s left');
    progress.finish();
    expect(writes.at(-1)).to.equal('\r\x1b[K');
  });

  it('a run that ends early leaves no trace', () => {
    const writes: string[] = [];
    const progress = new PublishProgress(
      10,
      (text) => writes.push(text),
      () => 0,
    );
    progress.update(10);
    progress.finish();
    expect(writes).to.deep.equal([]);
  });

  it('formats the end of a run without a time left', () => {
    expect(progressLine(500, 500, 1_000)).to.equal('published 500 of 500 (100%), 500 msg/s');
  });
});
