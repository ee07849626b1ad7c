/**
 * Hostile input for the fault suite, generated with fast-check from a seed:
 * random bytes, deeply nested JSON, huge arrays, wrong types, empty SKUs and
 * lone surrogates, bodies over the size limit. Each sample carries the reason
 * codes Tally may give it. Unicode SKUs that are well formed are good input:
 * they come with their own ground truth.
 */
import fc from 'fast-check';

export interface HostileSample {
  readonly kind: string;
  readonly body: Buffer;
  /** Acceptable reason codes; null: any code (random bytes). */
  readonly codes: ReadonlySet<string> | null;
}

const json = (value: unknown) => Buffer.from(JSON.stringify(value));
const codes = (...list: string[]) => new Set(list);

/** A value of any JSON type but `want`. */
function notA(want: 'string' | 'array' | 'integer'): fc.Arbitrary<unknown> {
  const all: Record<string, fc.Arbitrary<unknown>> = {
    string: fc.string({ maxLength: 8 }),
    array: fc.array(fc.integer(), { maxLength: 3 }),
    integer: fc.integer(),
    fraction: fc.double({ noNaN: true, noDefaultInfinity: true }).filter((d) => !Number.isInteger(d)),
    boolean: fc.boolean(),
    object: fc.dictionary(fc.string({ maxLength: 4 }), fc.integer(), { maxKeys: 2 }),
    null: fc.constant(null),
  };
  const excluded = want === 'integer' ? ['integer'] : [want];
  return fc.oneof(
    ...Object.entries(all)
      .filter(([name]) => !excluded.includes(name))
      .map(([, arb]) => arb),
  );
}

export function hostileCorpus(seed: number, count: number, maxBytes: number, idPrefix: string): HostileSample[] {
  let n = 0;
  const id = () => `${idPrefix}-h${n++}`;
  const sample: fc.Arbitrary<HostileSample> = fc.oneof(
    fc.uint8Array({ minLength: 0, maxLength: 3_000 }).map((bytes) => ({ kind: 'random bytes', body: Buffer.from(bytes), codes: null })),
    fc.integer({ min: 2, max: 20_000 }).map((depth) => ({
      kind: 'deeply nested changes',
      body: Buffer.from(`{"id":"${id()}","changes":${'['.repeat(depth)}${']'.repeat(depth)}}`),
      codes: codes('invalid-change'),
    })),
    fc.integer({ min: 1, max: 10_000 }).map((depth) => ({
      kind: 'deeply nested id',
      body: Buffer.from(`{"id":${'{"a":'.repeat(depth)}1${'}'.repeat(depth)},"changes":[]}`),
      codes: codes('invalid-id'),
    })),
    fc.integer({ min: 10_001, max: 30_000 }).map((length) => ({
      kind: 'huge array',
      body: json({ id: id(), changes: new Array<number>(length).fill(0) }),
      codes: codes('too-many-changes'),
    })),
    fc.integer({ min: 1, max: 3 * maxBytes }).map((extra) => ({
      kind: 'over the size limit',
      body: json({ id: id(), changes: [{ sku: 'A', delta: 1 }], pad: 'x'.repeat(maxBytes + extra) }),
      codes: codes('oversized-body'),
    })),
    notA('string').map((value) => ({
      kind: 'wrong type: id',
      body: json({ id: value, changes: [{ sku: 'A', delta: 1 }] }),
      codes: codes('invalid-id', 'missing-id'),
    })),
    notA('array').map((value) => ({
      kind: 'wrong type: changes',
      body: json({ id: id(), changes: value }),
      codes: codes('changes-not-array', 'missing-changes'),
    })),
    notA('string').map((value) => ({ kind: 'wrong type: sku', body: json({ id: id(), changes: [{ sku: value, delta: 1 }] }), codes: codes('invalid-sku') })),
    notA('integer').map((value) => ({
      kind: 'wrong type: delta',
      body: json({ id: id(), changes: [{ sku: 'A', delta: value }] }),
      codes: codes('invalid-delta'),
    })),
    fc.oneof(fc.integer(), fc.boolean(), fc.array(fc.string())).map((value) => ({
      kind: 'wrong type: type',
      body: json({ id: id(), changes: [{ sku: 'A', delta: 1, type: value }] }),
      codes: codes('invalid-type'),
    })),
    fc.constant(null).map(() => ({ kind: 'empty sku', body: json({ id: id(), changes: [{ sku: '', delta: 1 }] }), codes: codes('invalid-sku') })),
    fc.integer({ min: 0xd800, max: 0xdfff }).map((unit) => ({
      kind: 'lone surrogate in a sku',
      body: json({ id: id(), changes: [{ sku: `S${String.fromCharCode(unit)}`, delta: 1 }] }),
      codes: codes('invalid-sku'),
    })),
  );
  return fc.sample(sample, { numRuns: count, seed });
}

export interface UnicodeGood {
  readonly body: Buffer;
  readonly sku: string;
  readonly delta: number;
}

/** Good messages with well-formed unicode SKUs (emoji, combining marks, RTL, CJK); each SKU is new. */
export function unicodeGood(seed: number, count: number, idPrefix: string): UnicodeGood[] {
  const skus = fc.sample(fc.string({ unit: 'grapheme', minLength: 1, maxLength: 12 }), { numRuns: count * 2, seed });
  const unique = [...new Set(skus.map((s) => `u-${s}`))].slice(0, count);
  return unique.map((sku, i) => {
    const delta = 1 + (i % 9);
    return { sku, delta, body: json({ id: `${idPrefix}-u${i}`, changes: [{ sku, delta }] }) };
  });
}
