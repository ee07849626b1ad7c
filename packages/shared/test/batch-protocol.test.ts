import { expect } from 'chai';
import { decodeBatchTask, encodeBatchTask, isBatchReply, partName, transferListOf, type WireParts } from '../src/batch-protocol.js';
import { markerDigest, markerDigestText, markerShardOf } from '../src/markers.js';
import type { PartChanges } from '../src/shards.js';

/** Parts as the encoder reads them, by index. */
function wireParts(parts: ReadonlyArray<{ digest: Uint8Array; changes: PartChanges; messageParts?: number }>): WireParts {
  return { count: parts.length, digest: (i) => parts[i]!.digest, changes: (i) => parts[i]!.changes, messageParts: (i) => parts[i]!.messageParts ?? 1 };
}

describe('batch protocol (the thread boundary)', () => {
  it('round-trips parts, SKUs with any characters, empty and big parts, and the traceparent, in one transferred buffer', () => {
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
      {
        id: 'm-5',
        changes: [
          ['\u{1F600}x', -Number.MAX_SAFE_INTEGER],
          ['', 3],
          ['\ud800', 1],
        ],
      },
    ];
    const parts = raw.map((p, i) => ({ ...p, digest: markerDigest(p.id), messageParts: i + 1 }));
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const wire = encodeBatchTask(7, 'batch-7a', wireParts(parts), traceparent);
    expect(Object.keys(wire).sort(), 'a buffer and three primitives: nothing else to clone').to.deep.equal(['batchId', 'buffer', 'traceparent', 'vshard']);
    expect(wire.buffer).to.be.instanceOf(ArrayBuffer);
    // As postMessage moves it: the sender's buffer is detached, the receiver gets the same bytes.
    const moved = structuredClone(wire, { transfer: transferListOf(wire) });
    expect(wire.buffer.byteLength, 'moved, not copied').to.equal(0);
    const task = decodeBatchTask(moved);
    expect(task.vshard).to.equal(7);
    expect(task.batchId, "the coordinator's batch id crosses unchanged").to.equal('batch-7a');
    expect(task, 'ids do not travel').to.not.have.property('ids');
    expect(task.digests!.map((d) => Buffer.from(d).toString('hex'))).to.deep.equal(parts.map((p) => p.digest.toString('hex')));
    // A lone surrogate is encoded as U+FFFD, as Buffer.from does (and so the shard hash, shards.ts).
    expect(task.changes).to.deep.equal(parts.map((p) => p.changes.map(([sku, delta]) => [sku === '\ud800' ? '\ufffd' : sku, delta])));
    expect([...task.shares!]).to.deep.equal(parts.map((p) => 1 / p.messageParts));
    // Against the input, not the encoder's output: an encoder that dropped it would pass the latter.
    expect(task.traceparent).to.equal(traceparent);
    expect(decodeBatchTask(encodeBatchTask(1, 'b', wireParts(parts.slice(0, 1))))).to.not.have.property('traceparent');
  });

  it("carries the coordinator's digest text as the same bytes, and both forms pick the same marker shard", () => {
    const ids = ['m-1', 'weird, "id" {7}\u00e9', ''];
    for (const id of ids) {
      const text = markerDigestText(id);
      expect(Buffer.from(text.slice(0, 16), 'latin1').toString('hex')).to.equal(markerDigest(id).toString('hex'));
      expect(markerShardOf(text, 16)).to.equal(markerShardOf(markerDigest(id), 16));
    }
    const wire = encodeBatchTask(2, 'b', { count: ids.length, digest: (i) => markerDigestText(ids[i]!), changes: () => [['A', 1]], messageParts: () => 1 });
    expect(decodeBatchTask(wire).digests!.map((d) => Buffer.from(d).toString('hex'))).to.deep.equal(ids.map((id) => markerDigest(id).toString('hex')));
  });

  it('encodes batches larger than any before it, and a small one after, exactly (the reused scratch)', () => {
    const big = Array.from({ length: 3000 }, (_, i) => ({
      digest: markerDigest(`m-${i}`),
      changes: [
        [`S${i}`, i],
        ['T', -i],
      ] as PartChanges,
    }));
    const small = [{ digest: markerDigest('m-x'), changes: [['X', 7]] as PartChanges }];
    for (const parts of [big, small, big]) {
      const task = decodeBatchTask(encodeBatchTask(1, 'b', wireParts(parts)));
      expect(task.changes).to.deep.equal(parts.map((p) => p.changes));
      expect(task.digests!.map((d) => Buffer.from(d).toString('hex'))).to.deep.equal(parts.map((p) => p.digest.toString('hex')));
    }
  });

  it('names a part by its digest in a log line, by its id only in a task a test built', () => {
    const digest = markerDigest('m-1');
    expect(partName({ digests: [digest] }, 0)).to.equal(digest.toString('hex'));
    expect(partName({ ids: ['m-1'], digests: [digest] }, 0)).to.equal('m-1');
  });

  it('refuses a malformed wire task instead of misreading it', () => {
    const good = encodeBatchTask(1, 'b', wireParts([{ digest: markerDigest('m-1'), changes: [['A', 1]] }]));
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', buffer: good.buffer.slice(0, good.buffer.byteLength - 1) })).to.throw(TypeError, /bytes/);
    const extra = new Uint8Array(good.buffer.byteLength + 1);
    extra.set(new Uint8Array(good.buffer));
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', buffer: extra.buffer })).to.throw(TypeError, /bytes/);
    const otherVersion = good.buffer.slice(0);
    new Uint32Array(otherVersion, 0, 1)[0] = 1;
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', buffer: otherVersion })).to.throw(TypeError, /wire version/);
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b', buffer: new ArrayBuffer(4) })).to.throw(TypeError);
    expect(() => decodeBatchTask({ vshard: 1, batchId: 'b' } as never)).to.throw(TypeError);
  });
});

describe('isBatchReply', () => {
  const result = { vshard: 1, marked: new Uint8Array(2), refusals: [], writeRetries: 0 };
  it('accepts the two shapes a thread answers with', () => {
    expect(isBatchReply({ kind: 'batch-done', result })).to.equal(true);
    expect(isBatchReply({ kind: 'batch-failed', failureClass: 'transient', message: 'Connection is closed.' })).to.equal(true);
    expect(isBatchReply({ kind: 'batch-failed', failureClass: 'bug', message: 'x', stack: 'TypeError: x\n    at f' })).to.equal(true);
  });

  it('refuses anything else, so the coordinator reports it as a bug instead of trusting it', () => {
    for (const reply of [
      undefined,
      null,
      'ok',
      { ok: 'yes', result },
      { ok: true },
      { kind: 'batch-done', result: { ...result, marked: [1, 1] } },
      { kind: 'batch-done', result: { marked: new Uint8Array(1) } },
      { kind: 'batch-failed', failureClass: 'outage', message: 'x' },
      { kind: 'batch-failed', failureClass: 'bug' },
      { kind: 'batch-failed', failureClass: 'bug', message: 'x', stack: 42 },
    ]) {
      expect(isBatchReply(reply), JSON.stringify(reply)).to.equal(false);
    }
  });
});
