/**
 * A stream partition's recent message ids, in the daemon's memory
 * (TALLY_SOURCE=stream with TALLY_STREAM_DEDUP): a producer that publishes
 * an id twice puts it at two offsets of one partition, and the later copy
 * is skipped while the first is younger than the window (TALLY_MARKER_TTL_S),
 * with no Redis work at all.
 *
 * The rule is deterministic, so every daemon reading the same log decides
 * alike: the lowest offset recorded for an id is the original. `admit`
 * answers `new` (not recorded: now it is), `same` (recorded at this very
 * offset: the same message read again, after a rewind or a reconnect; the
 * watermarks decide), or `duplicate` (recorded at a lower offset: skip it).
 * Read at an offset below the recorded one (the log replayed from before the
 * copy seen first), the id moves down to it and the answer is `new`.
 *
 * Memory: open addressing with linear probing over typed arrays, keyed on
 * 64 bits of the id's digest (markers.ts: SHA-256 of the id), with a FIFO
 * ring of insertion order for expiry; deletion shifts the following entries
 * back instead of leaving tombstones, so probes stay short however many ids
 * come and go. No JS Map: V8's tops out near 16.7 M entries and costs about
 * 100 bytes each; here an id costs 16 bytes of table (key, offset) times the
 * inverse load factor (at most 0.5 before growth, so 32 to 64) plus 12 bytes
 * of ring (its key and when it came): 44 to 76 bytes, 56 on average between
 * growths. At 20 k msg/s and 600 s a window holds 12 M ids.
 *
 * 64 bits: a new id taken for a duplicate needs its 64 bits to equal one of
 * the live ids'; with 12 M live ids that is 12e6 / 2^64 ≈ 6.5e-13 per message,
 * about once in 50 years at 20 k msg/s.
 */
import type { DigestText } from './markers.js';

export type WindowVerdict = 'new' | 'same' | 'duplicate';

export interface IdWindowOptions {
  /** How long an id is remembered after it was recorded, in ms. */
  readonly ttlMs: number;
  /** Slots to start with (a power of two is used, at least this); the table doubles as it fills. */
  readonly initialCapacity?: number;
}

/** Slot marker: an empty slot has key 0/0, so a real key of 0/0 is stored as 0/1 (one value in 2^64 shares it). */
const EMPTY = 0;

export class IdWindow {
  private readonly ttlMs: number;
  private mask: number;
  private hi: Uint32Array;
  private lo: Uint32Array;
  private offsets: Float64Array;
  /** When each slot's id was recorded (ms), for the ring's expiry to recognise it. */
  private recordedAt: Float64Array;
  private count = 0;
  // The ring: keys and times in the order recorded; head is the oldest.
  private ringHi: Uint32Array;
  private ringLo: Uint32Array;
  private ringAt: Float64Array;
  private ringHead = 0;
  private ringLength = 0;

  constructor(options: IdWindowOptions) {
    this.ttlMs = options.ttlMs;
    let capacity = 16;
    while (capacity < (options.initialCapacity ?? 1024) * 2) capacity *= 2;
    this.mask = capacity - 1;
    this.hi = new Uint32Array(capacity);
    this.lo = new Uint32Array(capacity);
    this.offsets = new Float64Array(capacity);
    this.recordedAt = new Float64Array(capacity);
    const ring = capacity / 2;
    this.ringHi = new Uint32Array(ring);
    this.ringLo = new Uint32Array(ring);
    this.ringAt = new Float64Array(ring);
  }

  /** Ids remembered now. */
  get size(): number {
    return this.count;
  }

  /** Bytes held by the arrays. */
  get bytes(): number {
    return (
      this.hi.byteLength +
      this.lo.byteLength +
      this.offsets.byteLength +
      this.recordedAt.byteLength +
      this.ringHi.byteLength +
      this.ringLo.byteLength +
      this.ringAt.byteLength
    );
  }

  admit(digest: Uint8Array | DigestText, offset: number, nowMs: number): WindowVerdict {
    const hi = word(digest, 0);
    let lo = word(digest, 4);
    if (hi === EMPTY && lo === EMPTY) lo = 1;
    let slot = this.slotOf(hi, lo);
    while (this.hi[slot] !== EMPTY || this.lo[slot] !== EMPTY) {
      if (this.hi[slot] === hi && this.lo[slot] === lo) {
        const recorded = this.offsets[slot]!;
        if (offset === recorded) return 'same';
        if (offset > recorded) return 'duplicate';
        // The log is read from before the copy seen first: this one is the original.
        this.offsets[slot] = offset;
        return 'new';
      }
      slot = (slot + 1) & this.mask;
    }
    if ((this.count + 1) * 2 > this.mask + 1) {
      this.grow();
      return this.admit(digest, offset, nowMs);
    }
    this.hi[slot] = hi;
    this.lo[slot] = lo;
    this.offsets[slot] = offset;
    this.recordedAt[slot] = nowMs;
    this.count++;
    this.pushRing(hi, lo, nowMs);
    return 'new';
  }

  /** Forgets the ids recorded more than the window's TTL before `nowMs`, oldest first. */
  expire(nowMs: number): void {
    const horizon = nowMs - this.ttlMs;
    const size = this.ringHi.length;
    while (this.ringLength > 0 && this.ringAt[this.ringHead]! <= horizon) {
      const hi = this.ringHi[this.ringHead]!;
      const lo = this.ringLo[this.ringHead]!;
      const at = this.ringAt[this.ringHead]!;
      this.ringHead = (this.ringHead + 1) % size;
      this.ringLength--;
      this.remove(hi, lo, at);
    }
  }

  private slotOf(hi: number, lo: number): number {
    // The digest is a hash already: its low bits spread the slots.
    return (lo ^ hi) & this.mask;
  }

  /** Deletes the key recorded at `at` (a key recorded anew since, after a deletion, has another time and stays). */
  private remove(hi: number, lo: number, at: number): void {
    let slot = this.slotOf(hi, lo);
    while (this.hi[slot] !== hi || this.lo[slot] !== lo) {
      if (this.hi[slot] === EMPTY && this.lo[slot] === EMPTY) return;
      slot = (slot + 1) & this.mask;
    }
    if (this.recordedAt[slot] !== at) return;
    // Backward shift: pull each later entry of the run into the hole when its home is at or before the hole.
    let hole = slot;
    let next = (hole + 1) & this.mask;
    while (this.hi[next] !== EMPTY || this.lo[next] !== EMPTY) {
      const home = this.slotOf(this.hi[next]!, this.lo[next]!);
      // Whether `home` lies cyclically outside (hole, next]: then the entry may move to the hole.
      const movable = hole <= next ? home <= hole || home > next : home <= hole && home > next;
      if (movable) {
        this.hi[hole] = this.hi[next]!;
        this.lo[hole] = this.lo[next]!;
        this.offsets[hole] = this.offsets[next]!;
        this.recordedAt[hole] = this.recordedAt[next]!;
        hole = next;
      }
      next = (next + 1) & this.mask;
    }
    this.hi[hole] = EMPTY;
    this.lo[hole] = EMPTY;
    this.count--;
  }

  private pushRing(hi: number, lo: number, at: number): void {
    if (this.ringLength === this.ringHi.length) this.growRing();
    const tail = (this.ringHead + this.ringLength) % this.ringHi.length;
    this.ringHi[tail] = hi;
    this.ringLo[tail] = lo;
    this.ringAt[tail] = at;
    this.ringLength++;
  }

  private growRing(): void {
    const size = this.ringHi.length;
    const hi = new Uint32Array(size * 2);
    const lo = new Uint32Array(size * 2);
    const at = new Float64Array(size * 2);
    for (let i = 0; i < this.ringLength; i++) {
      const from = (this.ringHead + i) % size;
      hi[i] = this.ringHi[from]!;
      lo[i] = this.ringLo[from]!;
      at[i] = this.ringAt[from]!;
    }
    this.ringHi = hi;
    this.ringLo = lo;
    this.ringAt = at;
    this.ringHead = 0;
  }

  private grow(): void {
    const { hi, lo, offsets, recordedAt } = this;
    const capacity = (this.mask + 1) * 2;
    this.mask = capacity - 1;
    this.hi = new Uint32Array(capacity);
    this.lo = new Uint32Array(capacity);
    this.offsets = new Float64Array(capacity);
    this.recordedAt = new Float64Array(capacity);
    for (let i = 0; i < hi.length; i++) {
      if (hi[i] === EMPTY && lo[i] === EMPTY) continue;
      let slot = this.slotOf(hi[i]!, lo[i]!);
      while (this.hi[slot] !== EMPTY || this.lo[slot] !== EMPTY) slot = (slot + 1) & this.mask;
      this.hi[slot] = hi[i]!;
      this.lo[slot] = lo[i]!;
      this.offsets[slot] = offsets[i]!;
      this.recordedAt[slot] = recordedAt[i]!;
    }
  }
}

/** Four bytes of a digest, as an unsigned 32-bit integer (a DigestText holds one byte per character). */
function word(digest: Uint8Array | DigestText, at: number): number {
  if (typeof digest === 'string')
    return ((digest.charCodeAt(at) << 24) | (digest.charCodeAt(at + 1) << 16) | (digest.charCodeAt(at + 2) << 8) | digest.charCodeAt(at + 3)) >>> 0;
  return ((digest[at]! << 24) | (digest[at + 1]! << 16) | (digest[at + 2]! << 8) | digest[at + 3]!) >>> 0;
}
