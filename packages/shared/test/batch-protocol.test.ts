import { expect } from 'chai';
import { decodeBatchTask, encodeBatchTask, markerDigest, type PartChanges } from '../src/index.js';

describe('batch protocol (the thread boundary)', () => {
  it('round-trips parts, their marker digests, empty and big parts, and the traceparent', () => {
    const parts: Array<{ digest: Uint8Array; changes: PartChanges }> = [
      { digest: markerDigest('m-1'), changes: [['A', 1], ['B', -2]] },
      { digest: markerDigest('weird, "id" {7}\u00e9'), changes: [['ü', Number.MAX_SAFE_INTEGER]] },
      { digest: markerDigest('m-3'), changes: [] },
      { digest: markerDigest('m-4'), changes: Array.from({ length: 300 }, (_, i): [string, number] => [`S${i}`, i - 150]) },
    ];
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const wire = encodeBatchTask(7, parts.length, (i) => parts[i]!, traceparent);
    expect(wire.flat.every((v) => typeof v === 'string' || typeof v === 'number'), 'primitives only').to.equal(true);
    expect(wire.digests, 'the digests travel as one byte array').to.be.instanceOf(Uint8Array).with.length(4 * 16);
    const task = decodeBatchTask(structuredClone(wire));
    expect(task.vshard).to.equal(7);
    expect(task.digests!.map((d) => Buffer.from(d).toString('hex'))).to.deep.equal(parts.map((p) => Buffer.from(p.digest).toString('hex')));
    expect(task.changes).to.deep.equal(parts.map((p) => p.changes));
    // Against the input, not the encoder's output: an encoder that dropped it would pass the latter.
    expect(task.traceparent).to.equal(traceparent);
    expect(decodeBatchTask(encodeBatchTask(1, 1, () => parts[0]!))).to.not.have.property('traceparent');
  });

  it('refuses a malformed wire task instead of misreading it', () => {
    const digests = new Uint8Array(32);
    expect(() => decodeBatchTask({ vshard: 1, parts: 2, flat: [1, 'A', 1, 'B'], digests })).to.throw(TypeError);
    expect(() => decodeBatchTask({ vshard: 1, parts: 1, flat: [1, 'A', 1, 'extra'], digests: digests.subarray(0, 16) })).to.throw(/left over/);
    expect(() => decodeBatchTask({ vshard: 1, parts: 2, flat: [0, 0], digests: digests.subarray(0, 16) })).to.throw(/digest bytes/);
  });
});
