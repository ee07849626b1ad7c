/**
 * Bad messages for test loads, each with the reason code Tally must dead-letter it with.
 */
import type { BadMessageReason } from '@tally/shared';

export interface BadSample {
  readonly body: Buffer;
  readonly reason: BadMessageReason;
  /** An id outside the body: the messageId property (contract shape), the id header (foreign shape). */
  readonly messageId?: string;
  /** Foreign shape: the mapped path the reason must name. */
  readonly path?: string;
}

/**
 * Bad messages the publisher mixes in, each with the reason Tally must give.
 * `n` makes each body distinct so the dead-letter queue can be matched 1:1.
 */
export function badSample(kind: number, n: number, maxBytes: number): BadSample {
  const json = (value: unknown) => Buffer.from(JSON.stringify(value));
  const samples: Array<() => BadSample> = [
    () => ({ body: Buffer.from(`{"id":"bad-${n}","changes":[{"sku":"A","delta":1}`), reason: 'malformed-json' }),
    () => ({ body: json({ changes: [{ sku: `bad-${n}`, delta: 1 }] }), reason: 'missing-id' }),
    () => ({ body: json({ id: `bad-${n}`, changes: [{ sku: 'A', delta: 1.5 }] }), reason: 'invalid-delta' }),
    () => ({ body: json({ id: `bad-${n}`, changes: { sku: 'A', delta: 1 } }), reason: 'changes-not-array' }),
    () => ({ body: json({ id: `bad-${n}`, changes: [{ sku: 42, delta: 1 }] }), reason: 'invalid-sku' }),
    () => ({ body: Buffer.alloc(0), reason: 'empty-body', messageId: `bad-${n}` }),
    () => ({ body: json({ id: `bad-${n}`, changes: [{ sku: 'A', delta: 2 ** 60 }] }), reason: 'unsafe-delta' }),
    () => ({ body: json([`bad-${n}`]), reason: 'not-an-object' }),
    () => ({
      body: Buffer.concat([Buffer.from(`{"id":"bad-${n}","changes":[{"sku":"`), Buffer.from([0xc3, 0x28]), Buffer.from('","delta":1}]}')]),
      reason: 'invalid-utf8',
    }),
    () => ({ body: json({ id: `bad-${n}`, changes: [{ sku: 'A', delta: 1, pad: 'x'.repeat(maxBytes) }] }), reason: 'oversized-body' }),
    () => ({ body: json({ id: 7, changes: [] }), reason: 'invalid-id', messageId: `bad-${n}` }),
    () => ({ body: json({ id: `bad-${n}`, changes: [{ sku: 'A', delta: '3' }] }), reason: 'invalid-delta' }),
    () => ({ body: json({ id: `bad-${n}`, changes: [{ sku: 'A', delta: 1, type: 9 }] }), reason: 'invalid-type' }),
    () => ({ body: json({ id: `bad-${n}`, changes: [null] }), reason: 'invalid-change' }),
  ];
  return samples[kind % samples.length]!();
}

/**
 * Bad messages of the foreign shape (foreign-shape.ts), each with the reason
 * Tally gives under FOREIGN_SHAPE_MAPPING and, where the reason is about a
 * value, the mapped path it must name. `n` makes each body distinct.
 */
export function foreignBadSample(kind: number, n: number, maxBytes: number): BadSample {
  const json = (value: unknown) => Buffer.from(JSON.stringify(value));
  const line = (fields: Record<string, unknown> = {}) => ({ product: { sku: 'A-1' }, qty: 1, ...fields });
  const samples: Array<() => BadSample> = [
    () => ({ body: Buffer.from(`{"eventId":"bad-${n}","warehouse":"WH1","lines":[`), reason: 'malformed-json' }),
    () => ({ body: json({ warehouse: `bad-${n}`, lines: [line()] }), reason: 'missing-id', path: '/eventId' }),
    () => ({
      body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: [line(), line(), line(), line({ qty: '2' })] }),
      reason: 'invalid-delta',
      path: '/lines/3/qty',
    }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: line() }), reason: 'changes-not-array', path: '/lines' }),
    () => ({
      body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: [line({ product: { code: 'A-1' } })] }),
      reason: 'invalid-sku',
      path: '/lines/0/product/sku',
    }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH:1', lines: [line()] }), reason: 'invalid-sku', path: '/warehouse' }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: [line({ qty: 2 ** 60 })] }), reason: 'unsafe-delta', path: '/lines/0/qty' }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: [line({ reason: 9 })] }), reason: 'invalid-type', path: '/lines/0/reason' }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: [null] }), reason: 'invalid-change', path: '/lines/0' }),
    () => ({ body: json({ eventId: 7, warehouse: `bad-${n}`, lines: [] }), reason: 'invalid-id', path: '/eventId', messageId: `bad-${n}` }),
    () => ({ body: json({ warehouse: 'WH1', lines: [line({ qty: 1.5 })] }), reason: 'invalid-delta', path: '/lines/0/qty', messageId: `bad-${n}` }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH1' }), reason: 'missing-changes', path: '/lines' }),
    () => ({ body: Buffer.alloc(0), reason: 'empty-body', messageId: `bad-${n}` }),
    () => ({ body: json({ eventId: `bad-${n}`, warehouse: 'WH1', lines: [line({ pad: 'x'.repeat(maxBytes) })] }), reason: 'oversized-body' }),
    () => ({
      body: Buffer.concat([Buffer.from(`{"eventId":"bad-${n}","warehouse":"`), Buffer.from([0xc3, 0x28]), Buffer.from('","lines":[]}')]),
      reason: 'invalid-utf8',
    }),
  ];
  return samples[kind % samples.length]!();
}
