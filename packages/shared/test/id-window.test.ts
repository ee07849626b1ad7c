/**
 * The stream id window (id-window.ts) against a Map that does the same with
 * no cleverness: random admits of repeated ids at offsets up and down, time
 * moving, expiries, growth past the first capacity, and keys made to
 * collide so the backward-shift deletion is exercised.
 */
import { expect } from 'chai';
import fc from 'fast-check';
import { IdWindow, type WindowVerdict } from '../src/id-window.js';
import { markerDigest } from '../src/markers.js';

/** The rule, written plainly: the lowest offset recorded within the TTL is the original. */
class ModelWindow {
  private readonly ids = new Map<string, { offset: number; at: number }>();
  constructor(private readonly ttlMs: number) {}
  admit(key: string, offset: number, now: number): WindowVerdict {
    const found = this.ids.get(key);
    if (found === undefined) {
      this.ids.set(key, { offset, at: now });
      return 'new';
    }
    if (offset === found.offset) return 'same';
    if (offset > found.offset) return 'duplicate';
    found.offset = offset;
    return 'new';
  }
  expire(now: number): void {
    for (const [key, { at }] of this.ids) if (at <= now - this.ttlMs) this.ids.delete(key);
  }
  get size(): number {
    return this.ids.size;
  }
}

/** A digest whose first 8 bytes (the window's key) are chosen: low-bit collisions on purpose. */
function digestOf(hi: number, lo: number): Uint8Array {
  const digest = new Uint8Array(16);
  new DataView(digest.buffer).setUint32(0, hi);
  new DataView(digest.buffer).setUint32(4, lo);
  return digest;
}

describe('id window (stream producer duplicates)', () => {
  it('answers new, same and duplicate by the lowest offset, and moves an id down when the log is read from before it', () => {
    const window = new IdWindow({ ttlMs: 1_000 });
    const id = markerDigest('order-1');
    expect(window.admit(id, 10, 0)).to.equal('new');
    expect(window.admit(id, 10, 5)).to.equal('same');
    expect(window.admit(id, 25, 5)).to.equal('duplicate');
    expect(window.admit(id, 4, 6)).to.equal('new');
    expect(window.admit(id, 10, 7)).to.equal('duplicate');
    expect(window.admit(id, 4, 7)).to.equal('same');
    expect(window.size).to.equal(1);
  });

  it('forgets an id exactly TTL after it was recorded, not before', () => {
    const window = new IdWindow({ ttlMs: 1_000 });
    const id = markerDigest('order-2');
    window.admit(id, 1, 100);
    window.expire(1_099);
    expect(window.admit(id, 2, 1_099)).to.equal('duplicate');
    window.expire(1_100);
    expect(window.size).to.equal(0);
    expect(window.admit(id, 2, 1_100)).to.equal('new');
  });

  it('keeps every other id findable when one in the middle of a probe run is deleted', () => {
    const window = new IdWindow({ ttlMs: 10, initialCapacity: 16 });
    // Same low bits: one probe run. The first expires, the others must still be found.
    const ids = Array.from({ length: 6 }, (_, i) => digestOf(i + 1, 0x40));
    window.admit(ids[0]!, 1, 0);
    for (let i = 1; i < ids.length; i++) window.admit(ids[i]!, i + 1, 5);
    window.expire(10);
    expect(window.size).to.equal(ids.length - 1);
    for (let i = 1; i < ids.length; i++) expect(window.admit(ids[i]!, i + 1, 11), `id ${i}`).to.equal('same');
    expect(window.admit(ids[0]!, 1, 11)).to.equal('new');
  });

  it('matches the model over random admits, expiries and growth', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            key: fc.integer({ min: 0, max: 300 }),
            collide: fc.boolean(),
            offset: fc.integer({ min: 0, max: 2_000 }),
            step: fc.integer({ min: 0, max: 40 }),
            expire: fc.boolean(),
          }),
          { minLength: 1, maxLength: 600 },
        ),
        (steps) => {
          const window = new IdWindow({ ttlMs: 200, initialCapacity: 8 });
          const model = new ModelWindow(200);
          let now = 0;
          for (const step of steps) {
            now += step.step;
            if (step.expire) {
              window.expire(now);
              model.expire(now);
            }
            // Half the keys share their low bits with others: long probe runs.
            const hi = step.key;
            const lo = step.collide ? 7 : step.key * 2_654_435_761;
            expect(window.admit(digestOf(hi, lo >>> 0), step.offset, now)).to.equal(model.admit(`${hi}/${lo >>> 0}`, step.offset, now));
            expect(window.size).to.equal(model.size);
          }
        },
      ),
      { numRuns: 200 },
    );
  });

  it('holds a million ids in about 56 bytes each, and forgets them all', () => {
    const window = new IdWindow({ ttlMs: 1_000 });
    const n = 1_000_000;
    const digest = new Uint8Array(16);
    const view = new DataView(digest.buffer);
    for (let i = 0; i < n; i++) {
      view.setUint32(0, i * 2_654_435_761);
      view.setUint32(4, i);
      window.admit(digest, i, 0);
    }
    expect(window.size).to.equal(n);
    const perId = window.bytes / n;
    expect(perId).to.be.within(44, 76);
    window.expire(1_000);
    expect(window.size).to.equal(0);
  });
});
