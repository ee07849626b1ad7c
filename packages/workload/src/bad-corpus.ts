import type { BadMessageReason } from '@tally/shared';

export interface BadSample {
  readonly body: Buffer;
  readonly reason: BadMessageReason;
  readonly messageId?: string;
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
