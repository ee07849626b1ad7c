import { expect } from 'chai';
import { decodeBatchTask, encodeBatchTask, WindowGauge } from '../src/index.js';

describe('WindowGauge', () => {
  it('shows what a copy of its buffer (as a worker thread gets it in workerData) opens and closes', () => {
    const coordinator = WindowGauge.create(16);
    const thread = new WindowGauge(structuredClone(coordinator.buffer));
    thread.open(2, 100);
    thread.open(9, 1 / 3 + 0.5);
    expect(coordinator.messages()).to.be.closeTo(100 + 5 / 6, 1e-3);
    thread.close(2);
    expect(coordinator.messages()).to.be.closeTo(5 / 6, 1e-3);
    thread.close(9);
    expect(coordinator.messages()).to.equal(0);
  });

  it("reopening a shard's window replaces its figure rather than adding to it", () => {
    const gauge = WindowGauge.create(2);
    gauge.open(0, 7);
    gauge.open(0, 7);
    expect(gauge.messages()).to.equal(7);
  });

  it("crosses the thread boundary with each part's share of its message", () => {
    const parts = [
      { id: 'm-1', digest: new Uint8Array(16), changes: [['A', 1]] as [string, number][] },
      { id: 'm-2', digest: new Uint8Array(16), changes: [['B', 2]] as [string, number][] },
    ];
    const task = decodeBatchTask(structuredClone(encodeBatchTask(3, 'b-3', 2, (i) => parts[i]!, undefined, Float64Array.of(1, 0.25))));
    expect([...task.shares!]).to.deep.equal([1, 0.25]);
    expect(decodeBatchTask(encodeBatchTask(3, 'b-3', 2, (i) => parts[i]!))).to.not.have.property('shares');
    expect(() =>
      decodeBatchTask({ vshard: 3, batchId: 'b-3', parts: 1, flat: ['m-1', 1, 'A', 1], digests: new Uint8Array(16), shares: Float64Array.of(1, 1) }),
    ).to.throw(/shares/);
  });
});
