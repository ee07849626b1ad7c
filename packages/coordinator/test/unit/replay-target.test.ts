import { expect } from 'chai';
import { replayQueueOf } from '../../src/commands/replay-target.js';

describe('replay target (pure)', () => {
  it('one queue: always back to it', () => {
    expect(replayQueueOf(undefined, 'inv', 1)).to.equal('inv');
    expect(replayQueueOf({ 'x-tally-source-queue': 'elsewhere' }, 'inv', 1)).to.equal('inv');
  });

  it("partitions: back to the partition Tally's header or the broker's x-death names", () => {
    expect(replayQueueOf({ 'x-tally-source-queue': 'inv.3' }, 'inv', 4)).to.equal('inv.3');
    expect(replayQueueOf({ 'x-death': [{ queue: 'inv.1', reason: 'delivery_limit' }] }, 'inv', 4)).to.equal('inv.1');
  });

  it('partitions: keeps what names no partition queue of the deployment (never a guess)', () => {
    expect(replayQueueOf(undefined, 'inv', 4)).to.equal(null);
    expect(replayQueueOf({ 'x-tally-source-queue': 'inv' }, 'inv', 4), 'the exchange, not a queue').to.equal(null);
    expect(replayQueueOf({ 'x-tally-source-queue': 'inv.4' }, 'inv', 4), 'beyond N').to.equal(null);
    expect(replayQueueOf({ 'x-death': [{ queue: 7 }] }, 'inv', 4)).to.equal(null);
  });
});
