import { expect } from 'chai';
import { decodeBatchTask, encodeBatchTask } from '../src/batch-protocol.js';
import { WindowGauge } from '../src/window-gauge.js';

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
      { digest: new Uint8Array(16), changes: [['A', 1]] as [string, number][], messageParts: 1 },
      { digest: new Uint8Array(16), changes: [['B', 2]] as [string, number][], messageParts: 4 },
    ];
    const wire = encodeBatchTask(3, 'b-3', {
      count: 2,
      digest: (i) => parts[i]!.digest,
      changes: (i) => parts[i]!.changes,
      messageParts: (i) => parts[i]!.messageParts,
    });
    const task = decodeBatchTask(structuredClone(wire, { transfer: [wire.buffer] }));
    expect([...task.shares!]).to.deep.equal([1, 0.25]);
  });
});
