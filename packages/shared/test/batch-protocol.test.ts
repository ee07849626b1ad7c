import { expect } from 'chai';
import { decodeBatchTask, encodeBatchTask, isBatchReply, markerDigest, type PartChanges } from '../src/index.js';

describe('batch protocol (the thread boundary)', () => {
  it('round-trips parts, ids with any characters, empty and big parts, and the traceparent', () => {
    const raw: Array<{ id: string; changes: PartChanges }> = [
      {
        id: 'm-1',
        changes: [
          ['A', 1],
          ['B', -2],
        ],
      },
      { id: 'weird, "id" {7}\u00e9', changes: [['ü', Number.MAX_SAFE_INTEGER]] },
      { id: 'm-3', changes: [] },
      { id: 'm-4', changes: Array.from({ length: 300 }, (_, i): [string, number] => [`S${i}`, i - 150]) },
    ];
    const parts = raw.map((p) => ({ ...p, digest: markerDigest(p.id) }));
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const wire = encodeBatchTask(7, 'batch-7a', parts.length, (i) => parts[i]!, traceparent);
    expect(
      wire.flat.every((v) => typeof v === 'string' || typeof v === 'number'),
      'primitives only',
    ).to.equal(true);
    const task = decodeBatchTask(structuredClone(wire));
    expect(task.vshard).to.equal(7);
    expect(task.batchId, "the coordinator's batch id crosses unchanged").to.equal('batch-7a');
    expect(task.ids).to.deep.equal(parts.map((p) => p.id));
    expect(wire.digests, 'the digests travel as one byte array')
      .to.be.instanceOf(Uint8Array)
      .with.length(4 * 16);
    expect(task.digests!.map((d) => Buffer.from(d).toString('hex'))).to.deep.equal(parts.map((p) => p.digest.toString('hex')));
    expect(task.changes).to.deep.equal(parts.map((p) => p.changes));
    // Against the input, not the encoder's output: an encoder that dropped it would pass the latter.
    expect(task.traceparent).to.equal(traceparent);
    expect(decodeBatchTask(encodeBatchTask(1, 'b', 1, () => parts[0]!))).to.not.have.property('traceparent');
  });

  it('refuses a malformed wire task instead of misreading it', () => {
    const digests = new Uint8Array(32);
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', parts: 2, flat: ['m-1', 1, 'A', 1], digests })).to.throw(TypeError);
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', parts: 1, flat: ['m-1', 1, 'A', 1, 'extra'], digests: digests.subarray(0, 16) })).to.throw(
      /left over/,
    );
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', parts: 2, flat: ['m-1', 0, 'm-2', 0], digests: digests.subarray(0, 16) })).to.throw(/digest bytes/);
  });
});

describe('isBatchReply', () => {
  const result = { vshard: 1, marked: new Uint8Array(2), refusals: [], writeRetries: 0 };
  it('accepts the two shapes a thread answers with', () => {
    expect(isBatchReply({ ok: true, result })).to.equal(true);
    expect(isBatchReply({ ok: false, failureClass: 'transient', message: 'Connection is closed.' })).to.equal(true);
    expect(isBatchReply({ ok: false, failureClass: 'bug', message: 'x', stack: 'TypeError: x\n    at f' })).to.equal(true);
  });

  it('refuses anything else, so the coordinator reports it as a bug instead of trusting it', () => {
    for (const reply of [
      undefined,
      null,
      'ok',
      { ok: 'yes', result },
      { ok: true },
      { ok: true, result: { ...result, marked: [1, 1] } },
      { ok: true, result: { marked: new Uint8Array(1) } },
      { ok: false, failureClass: 'outage', message: 'x' },
      { ok: false, failureClass: 'bug' },
      { ok: false, failureClass: 'bug', message: 'x', stack: 42 },
    ]) {
      expect(isBatchReply(reply), JSON.stringify(reply)).to.equal(false);
    }
  });
});
