import { expect } from 'chai';
import { BAD_MESSAGE_REASONS, formatReason, MESSAGE_LIMITS, parseMessage, type BadMessageReason, type ParseOptions, type ParseResult } from '../src/message.js';

const OPTIONS: ParseOptions = { maxBytes: 65_536 };
const MAX = Number.MAX_SAFE_INTEGER;

function text(s: string): Uint8Array {
  return Buffer.from(s, 'utf8');
}

function json(value: unknown): Uint8Array {
  return text(JSON.stringify(value));
}

/** A well-formed body with one bad change placed at `changes[index]`. */
function withChangeAt(index: number, change: unknown): Uint8Array {
  const changes: unknown[] = [];
  for (let i = 0; i < index; i++) changes.push({ sku: `ok-${i}`, delta: 1 });
  changes.push(change);
  return json({ id: 'm-1', changes });
}

function expectBad(result: ParseResult): { reason: BadMessageReason; detail: string } {
  if (result.ok) throw new Error(`expected a bad message, got ${JSON.stringify(result.message)}`);
  return result;
}

function expectGood(result: ParseResult) {
  if (!result.ok) throw new Error(`expected a good message, got ${result.reason}: ${result.detail}`);
  return result.message;
}

interface BadCase {
  readonly name: string;
  readonly body: Uint8Array;
  readonly messageId?: unknown;
  readonly options?: ParseOptions;
  readonly reason: BadMessageReason;
  /** Substrings the detail must contain: where the problem is. */
  readonly detail?: readonly string[];
}

const BAD_CASES: readonly BadCase[] = [
  // The body as bytes.
  { name: 'empty body', body: new Uint8Array(0), reason: 'empty-body' },
  { name: 'empty body even with a messageId', body: new Uint8Array(0), messageId: 'm-1', reason: 'empty-body' },
  {
    name: 'oversized body (one byte past the limit)',
    body: json({ id: 'm-1', changes: [{ sku: 'x'.repeat(100), delta: 1 }] }),
    options: { maxBytes: 64 },
    reason: 'oversized-body',
    detail: ['64'],
  },
  { name: 'invalid UTF-8 (0xff)', body: Uint8Array.from([0x7b, 0xff, 0x7d]), reason: 'invalid-utf8' },
  { name: 'invalid UTF-8 (overlong encoding of "/")', body: Uint8Array.from([0x22, 0xc0, 0xaf, 0x22]), reason: 'invalid-utf8' },
  { name: 'invalid UTF-8 (encoded lone surrogate ED A0 80)', body: Uint8Array.from([0x22, 0xed, 0xa0, 0x80, 0x22]), reason: 'invalid-utf8' },
  { name: 'invalid UTF-8 (truncated 3-byte sequence)', body: Uint8Array.from([0x22, 0xe2, 0x82, 0x22]), reason: 'invalid-utf8' },
  // JSON syntax.
  { name: 'malformed JSON (truncated)', body: text('{"id":"m-1","changes":['), reason: 'malformed-json' },
  { name: 'malformed JSON (trailing comma)', body: text('{"id":"m-1","changes":[],}'), reason: 'malformed-json' },
  { name: 'malformed JSON (single quotes)', body: text("{'id':'m-1'}"), reason: 'malformed-json' },
  { name: 'malformed JSON (bare NaN delta)', body: text('{"id":"m-1","changes":[{"sku":"a","delta":NaN}]}'), reason: 'malformed-json' },
  { name: 'malformed JSON (only whitespace)', body: text('   \n\t '), reason: 'malformed-json' },
  { name: 'malformed JSON (two documents)', body: text('{"id":"a","changes":[]}{"id":"b","changes":[]}'), reason: 'malformed-json' },
  // Top-level shape.
  { name: 'top-level array', body: text('[{"id":"m-1","changes":[]}]'), reason: 'not-an-object', detail: ['array'] },
  { name: 'top-level number', body: text('42'), reason: 'not-an-object', detail: ['42'] },
  { name: 'top-level null', body: text('null'), reason: 'not-an-object', detail: ['null'] },
  { name: 'top-level string', body: text('"hello"'), reason: 'not-an-object', detail: ['"hello"'] },
  { name: 'top-level boolean', body: text('true'), reason: 'not-an-object', detail: ['boolean'] },
  // The id.
  { name: 'missing id, no messageId property', body: json({ changes: [] }), reason: 'missing-id' },
  { name: 'missing id, messageId property null', body: json({ changes: [] }), messageId: null, reason: 'missing-id' },
  { name: 'missing id, messageId property empty string', body: json({ changes: [] }), messageId: '', reason: 'missing-id' },
  {
    name: 'missing id: "id" only on a __proto__ object does not count',
    body: text('{"__proto__":{"id":"m-1"},"changes":[]}'),
    reason: 'missing-id',
  },
  { name: 'id is a number', body: json({ id: 42, changes: [] }), reason: 'invalid-id', detail: ['id', '42'] },
  { name: 'id is null', body: json({ id: null, changes: [] }), messageId: 'from-property', reason: 'invalid-id', detail: ['id', 'null'] },
  { name: 'id is an object', body: json({ id: { value: 'm-1' }, changes: [] }), reason: 'invalid-id', detail: ['id', 'object'] },
  { name: 'id is an array', body: json({ id: ['m-1'], changes: [] }), reason: 'invalid-id', detail: ['id', 'array'] },
  { name: 'id is a boolean', body: json({ id: true, changes: [] }), reason: 'invalid-id', detail: ['id'] },
  { name: 'id is empty', body: json({ id: '', changes: [] }), messageId: 'from-property', reason: 'invalid-id', detail: ['id', 'empty'] },
  { name: 'id with a lone surrogate', body: json({ id: 'm-\ud800', changes: [] }), reason: 'invalid-id', detail: ['id', 'surrogate'] },
  {
    name: 'sku with a lone surrogate',
    body: json({ id: 'm-1', changes: [{ sku: 'A\udc00', delta: 1 }] }),
    reason: 'invalid-sku',
    detail: ['changes[0].sku', 'surrogate'],
  },
  {
    name: 'id too long',
    body: json({ id: 'i'.repeat(MESSAGE_LIMITS.maxIdLength + 1), changes: [] }),
    reason: 'invalid-id',
    detail: ['id', String(MESSAGE_LIMITS.maxIdLength + 1), String(MESSAGE_LIMITS.maxIdLength)],
  },
  { name: 'messageId property is a number (no id in body)', body: json({ changes: [] }), messageId: 42, reason: 'invalid-id', detail: ['messageId', '42'] },
  { name: 'messageId property is an object (no id in body)', body: json({ changes: [] }), messageId: { id: 'x' }, reason: 'invalid-id', detail: ['messageId'] },
  {
    name: 'messageId property is a Buffer (no id in body)',
    body: json({ changes: [] }),
    messageId: Buffer.from('m-1'),
    reason: 'invalid-id',
    detail: ['messageId'],
  },
  {
    name: 'messageId property too long (no id in body)',
    body: json({ changes: [] }),
    messageId: 'p'.repeat(MESSAGE_LIMITS.maxIdLength + 1),
    reason: 'invalid-id',
    detail: ['messageId', String(MESSAGE_LIMITS.maxIdLength + 1)],
  },
  // The changes array.
  { name: 'missing changes', body: json({ id: 'm-1' }), reason: 'missing-changes', detail: ['changes'] },
  { name: 'changes is an object', body: json({ id: 'm-1', changes: { sku: 'a', delta: 1 } }), reason: 'changes-not-array', detail: ['changes', 'object'] },
  { name: 'changes is a string', body: json({ id: 'm-1', changes: '[]' }), reason: 'changes-not-array', detail: ['changes'] },
  { name: 'changes is null', body: json({ id: 'm-1', changes: null }), reason: 'changes-not-array', detail: ['changes', 'null'] },
  {
    name: 'too many changes',
    // Entries are not looked at before the count: zeros keep the body small.
    body: text(`{"id":"m-1","changes":[${new Array(MESSAGE_LIMITS.maxChanges + 1).fill('0').join(',')}]}`),
    reason: 'too-many-changes',
    detail: [String(MESSAGE_LIMITS.maxChanges + 1), String(MESSAGE_LIMITS.maxChanges)],
  },
  // One change.
  { name: 'change is a number', body: withChangeAt(2, 7), reason: 'invalid-change', detail: ['changes[2]'] },
  { name: 'change is null', body: withChangeAt(1, null), reason: 'invalid-change', detail: ['changes[1]', 'null'] },
  { name: 'change is an array', body: withChangeAt(0, ['a', 1]), reason: 'invalid-change', detail: ['changes[0]', 'array'] },
  { name: 'change is a string', body: withChangeAt(3, 'a:1'), reason: 'invalid-change', detail: ['changes[3]'] },
  { name: 'sku missing', body: withChangeAt(2, { delta: 1 }), reason: 'invalid-sku', detail: ['changes[2].sku'] },
  { name: 'sku is a number', body: withChangeAt(1, { sku: 12345, delta: 1 }), reason: 'invalid-sku', detail: ['changes[1].sku', '12345'] },
  { name: 'sku is null', body: withChangeAt(0, { sku: null, delta: 1 }), reason: 'invalid-sku', detail: ['changes[0].sku'] },
  { name: 'sku is empty', body: withChangeAt(2, { sku: '', delta: 1 }), reason: 'invalid-sku', detail: ['changes[2].sku', 'empty'] },
  {
    name: 'sku too long',
    body: withChangeAt(4, { sku: 's'.repeat(MESSAGE_LIMITS.maxSkuLength + 1), delta: 1 }),
    reason: 'invalid-sku',
    detail: ['changes[4].sku', String(MESSAGE_LIMITS.maxSkuLength + 1)],
  },
  { name: 'delta missing', body: withChangeAt(2, { sku: 'a' }), reason: 'invalid-delta', detail: ['changes[2].delta'] },
  { name: 'delta is a string', body: withChangeAt(1, { sku: 'a', delta: '5' }), reason: 'invalid-delta', detail: ['changes[1].delta', '"5"'] },
  { name: 'delta is the string "NaN"', body: withChangeAt(0, { sku: 'a', delta: 'NaN' }), reason: 'invalid-delta', detail: ['changes[0].delta'] },
  { name: 'delta is null', body: withChangeAt(0, { sku: 'a', delta: null }), reason: 'invalid-delta', detail: ['changes[0].delta'] },
  { name: 'delta is a boolean', body: withChangeAt(0, { sku: 'a', delta: true }), reason: 'invalid-delta', detail: ['changes[0].delta'] },
  { name: 'delta is a float', body: withChangeAt(2, { sku: 'a', delta: 1.5 }), reason: 'invalid-delta', detail: ['changes[2].delta', '1.5'] },
  { name: 'delta is a tiny float', body: withChangeAt(0, { sku: 'a', delta: 1e-7 }), reason: 'invalid-delta', detail: ['changes[0].delta'] },
  {
    name: 'delta overflows to Infinity (1e400)',
    body: text('{"id":"m-1","changes":[{"sku":"a","delta":1},{"sku":"b","delta":1e400}]}'),
    reason: 'invalid-delta',
    detail: ['changes[1].delta'],
  },
  {
    name: 'delta unsafe (2**60)',
    body: text(`{"id":"m-1","changes":[{"sku":"a","delta":1},{"sku":"b","delta":${2n ** 60n}}]}`),
    reason: 'unsafe-delta',
    detail: ['changes[1].delta'],
  },
  {
    name: 'delta unsafe (-(2**60))',
    body: text(`{"id":"m-1","changes":[{"sku":"b","delta":-${2n ** 60n}}]}`),
    reason: 'unsafe-delta',
    detail: ['changes[0].delta'],
  },
  {
    name: 'delta unsafe (2**53, one past the safe range)',
    body: text(`{"id":"m-1","changes":[{"sku":"b","delta":${2n ** 53n}}]}`),
    reason: 'unsafe-delta',
    detail: ['changes[0].delta'],
  },
  {
    name: 'per-SKU sum beyond the safe range',
    body: json({
      id: 'm-1',
      changes: [
        { sku: 'a', delta: MAX },
        { sku: 'b', delta: 1 },
        { sku: 'a', delta: 1 },
      ],
    }),
    reason: 'unsafe-delta',
    detail: ['changes[2]', '"a"'],
  },
  {
    name: 'per-SKU sum of |delta| beyond the safe range, signs mixed',
    body: json({
      id: 'm-1',
      changes: [
        { sku: 'a', delta: -MAX },
        { sku: 'a', delta: 5 },
        { sku: 'a', delta: -6 },
      ],
    }),
    reason: 'unsafe-delta',
    detail: ['changes[1]'],
  },
  { name: 'type is a number', body: withChangeAt(2, { sku: 'a', delta: 1, type: 3 }), reason: 'invalid-type', detail: ['changes[2].type', '3'] },
  { name: 'type is null', body: withChangeAt(1, { sku: 'a', delta: 1, type: null }), reason: 'invalid-type', detail: ['changes[1].type', 'null'] },
  { name: 'type is an object', body: withChangeAt(0, { sku: 'a', delta: 1, type: {} }), reason: 'invalid-type', detail: ['changes[0].type'] },
  {
    name: 'type too long',
    body: withChangeAt(3, { sku: 'a', delta: 1, type: 't'.repeat(MESSAGE_LIMITS.maxTypeLength + 1) }),
    reason: 'invalid-type',
    detail: ['changes[3].type', String(MESSAGE_LIMITS.maxTypeLength + 1)],
  },
];

describe('parseMessage', () => {
  describe('bad inputs (table)', () => {
    it('has at least 20 cases and covers every reason code', () => {
      expect(BAD_CASES.length).to.be.at.least(20);
      const covered = new Set(BAD_CASES.map((c) => c.reason));
      expect([...covered].sort()).to.deep.equal([...BAD_MESSAGE_REASONS].sort());
    });

    for (const c of BAD_CASES) {
      it(`${c.name} → ${c.reason}`, () => {
        let result: ParseResult | undefined;
        expect(() => {
          result = parseMessage(c.body, c.messageId, c.options ?? OPTIONS);
        }).not.to.throw();
        const bad = expectBad(result!);
        expect(bad.reason).to.equal(c.reason);
        expect(bad.detail).to.be.a('string').and.not.equal('');
        for (const part of c.detail ?? []) expect(bad.detail).to.include(part);
        expect(formatReason(bad.reason, bad.detail)).to.equal(`${c.reason}: ${bad.detail}`);
      });
    }
  });

  describe('limits are inclusive', () => {
    it('accepts a body of exactly maxBytes', () => {
      const body = json({ id: 'm-1', changes: [{ sku: 'a', delta: 1 }] });
      expectGood(parseMessage(body, undefined, { maxBytes: body.byteLength }));
      expect(expectBad(parseMessage(body, undefined, { maxBytes: body.byteLength - 1 })).reason).to.equal('oversized-body');
    });

    it('accepts an id, a sku and a type at their maximum lengths', () => {
      const id = 'i'.repeat(MESSAGE_LIMITS.maxIdLength);
      const sku = 's'.repeat(MESSAGE_LIMITS.maxSkuLength);
      const type = 't'.repeat(MESSAGE_LIMITS.maxTypeLength);
      const message = expectGood(parseMessage(json({ id, changes: [{ sku, delta: 1, type }] }), undefined, OPTIONS));
      expect(message).to.deep.equal({ id, changes: [{ sku, delta: 1, type }] });
    });

    it(`accepts exactly ${MESSAGE_LIMITS.maxChanges} changes`, () => {
      const changes = Array.from({ length: MESSAGE_LIMITS.maxChanges }, (_, i) => ({ sku: `s${i % 97}`, delta: 1 }));
      const message = expectGood(parseMessage(json({ id: 'm-1', changes }), undefined, { maxBytes: 1 << 20 }));
      expect(message.changes).to.have.length(MESSAGE_LIMITS.maxChanges);
    });

    it('accepts ±MAX_SAFE_INTEGER deltas and a per-SKU sum of |delta| of exactly MAX_SAFE_INTEGER', () => {
      const body = json({
        id: 'm-1',
        changes: [
          { sku: 'a', delta: MAX - 1 },
          { sku: 'a', delta: 1 },
          { sku: 'b', delta: -MAX },
          { sku: 'c', delta: MAX },
        ],
      });
      const message = expectGood(parseMessage(body, undefined, OPTIONS));
      expect(message.changes.map((c) => c.delta)).to.deep.equal([MAX - 1, 1, -MAX, MAX]);
    });

    it('checks per-SKU sums per SKU, not across SKUs', () => {
      const body = json({
        id: 'm-1',
        changes: [
          { sku: 'a', delta: MAX },
          { sku: 'b', delta: MAX },
          { sku: 'c', delta: MAX },
        ],
      });
      expectGood(parseMessage(body, undefined, OPTIONS));
    });
  });

  describe('good inputs', () => {
    it('takes the id from the body over the messageId property', () => {
      const message = expectGood(parseMessage(json({ id: 'from-body', changes: [] }), 'from-property', OPTIONS));
      expect(message.id).to.equal('from-body');
    });

    it('takes the id from the body even when the messageId property is of a wrong type', () => {
      const message = expectGood(parseMessage(json({ id: 'from-body', changes: [] }), 42, OPTIONS));
      expect(message.id).to.equal('from-body');
    });

    it('uses the messageId property when the body has no id', () => {
      const message = expectGood(parseMessage(json({ changes: [{ sku: 'a', delta: 2 }] }), 'from-property', OPTIONS));
      expect(message).to.deep.equal({ id: 'from-property', changes: [{ sku: 'a', delta: 2 }] });
    });

    it('ignores extra fields at the top level and in changes', () => {
      const body = json({
        id: 'm-1',
        source: 'pos-17',
        nested: { deep: [1, 2, 3] },
        changes: [
          { sku: 'a', delta: 3, warehouse: 'north', note: null },
          { sku: 'b', delta: -1, type: 'sale', extra: [1] },
        ],
      });
      const message = expectGood(parseMessage(body, undefined, OPTIONS));
      expect(message).to.deep.equal({
        id: 'm-1',
        changes: [
          { sku: 'a', delta: 3 },
          { sku: 'b', delta: -1, type: 'sale' },
        ],
      });
    });

    it('leaves out the type key when the change has no type', () => {
      const message = expectGood(parseMessage(json({ id: 'm-1', changes: [{ sku: 'a', delta: 1 }] }), undefined, OPTIONS));
      expect(Object.hasOwn(message.changes[0]!, 'type')).to.equal(false);
    });

    it('accepts a delta of 0 (the parser keeps it; splitting skips it)', () => {
      const message = expectGood(parseMessage(json({ id: 'm-1', changes: [{ sku: 'a', delta: 0 }] }), undefined, OPTIONS));
      expect(message.changes).to.deep.equal([{ sku: 'a', delta: 0 }]);
    });

    it('accepts -0 and 1.0 as integers', () => {
      const message = expectGood(
        parseMessage(text('{"id":"m-1","changes":[{"sku":"a","delta":-0},{"sku":"b","delta":1.0},{"sku":"c","delta":2e3}]}'), undefined, OPTIONS),
      );
      expect(message.changes.map((c) => c.delta)).to.deep.equal([-0, 1, 2000]);
    });

    it('accepts an empty changes array', () => {
      expect(expectGood(parseMessage(json({ id: 'm-1', changes: [] }), undefined, OPTIONS)).changes).to.deep.equal([]);
    });

    it('keeps unicode SKUs, ids and types intact', () => {
      const skus = ['café', '商品-42', '😀🎉', 'Ωmega', 'a\u0301', 'ü}:{x', 'tab\tsku', '\u2028line'];
      const body = json({ id: 'ид-😀', changes: skus.map((sku, i) => ({ sku, delta: i + 1, type: 'vente-é' })) });
      const message = expectGood(parseMessage(body, undefined, OPTIONS));
      expect(message.id).to.equal('ид-😀');
      expect(message.changes.map((c) => c.sku)).to.deep.equal(skus);
      expect(message.changes.every((c) => c.type === 'vente-é')).to.equal(true);
    });

    it('accepts JSON escapes in SKUs (\\u00e9, surrogate pair escapes)', () => {
      const message = expectGood(parseMessage(text('{"id":"m-1","changes":[{"sku":"caf\\u00e9-\\ud83d\\ude00","delta":1}]}'), undefined, OPTIONS));
      expect(message.changes[0]!.sku).to.equal('café-😀');
    });

    it('strips a UTF-8 byte order mark', () => {
      const body = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"id":"m-1","changes":[]}')]);
      expect(expectGood(parseMessage(body, undefined, OPTIONS)).id).to.equal('m-1');
    });

    it('keeps the order of changes, including repeated SKUs', () => {
      const changes = [
        { sku: 'b', delta: 1 },
        { sku: 'a', delta: 2 },
        { sku: 'b', delta: -3 },
      ];
      expect(expectGood(parseMessage(json({ id: 'm-1', changes }), undefined, OPTIONS)).changes).to.deep.equal(changes);
    });
  });

  describe('hostile structure', () => {
    it('returns a reason for 100k nested arrays at the top level and does not throw', () => {
      const depth = 100_000;
      const body = text('['.repeat(depth) + ']'.repeat(depth));
      let result: ParseResult | undefined;
      expect(() => {
        result = parseMessage(body, undefined, { maxBytes: 1 << 24 });
      }).not.to.throw();
      expect(['not-an-object', 'malformed-json']).to.include(expectBad(result!).reason);
    });

    it('returns a reason for 100k nested arrays inside changes and does not throw', () => {
      const depth = 100_000;
      const body = text(`{"id":"m-1","changes":[${'['.repeat(depth)}${']'.repeat(depth)}]}`);
      let result: ParseResult | undefined;
      expect(() => {
        result = parseMessage(body, undefined, { maxBytes: 1 << 24 });
      }).not.to.throw();
      expect(['invalid-change', 'malformed-json']).to.include(expectBad(result!).reason);
    });

    it('returns a reason for 100k nested objects and does not throw', () => {
      const depth = 100_000;
      const body = text(`{"id":"m-1","changes":${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}}`);
      let result: ParseResult | undefined;
      expect(() => {
        result = parseMessage(body, undefined, { maxBytes: 1 << 24 });
      }).not.to.throw();
      expect(['changes-not-array', 'malformed-json']).to.include(expectBad(result!).reason);
    });

    it('never throws on random bytes and always returns a known reason or a message', () => {
      // Seeded so a failure is reproducible.
      let seed = 0x5eed;
      const random = () => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return seed / 2 ** 32;
      };
      const alphabet = Buffer.concat([Buffer.from('{}[]":,-0123456789.eE idchangesskudeltatype\\u'), Buffer.from([0xff, 0x80, 0xc3, 0xed])]);
      for (let n = 0; n < 2000; n++) {
        const length = Math.floor(random() * 80);
        const body = new Uint8Array(length);
        for (let i = 0; i < length; i++) body[i] = alphabet[Math.floor(random() * alphabet.length)]!;
        const result = parseMessage(body, random() < 0.5 ? undefined : 'mid', OPTIONS);
        if (!result.ok) expect(BAD_MESSAGE_REASONS).to.include(result.reason);
      }
    });
  });

  describe('the shortcuts of the common case', () => {
    it('rejects exactly the bodies a fatal UTF-8 TextDecoder rejects (random bytes, BOMs, multi-byte sequences)', () => {
      // The body is decoded with Buffer (isUtf8, then toString) instead of TextDecoder: the verdicts must agree.
      const reference = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });
      let seed = 0xdec0de;
      const random = () => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return seed / 2 ** 32;
      };
      const pieces = [
        [0x22],
        [0x61],
        [0xef, 0xbb, 0xbf],
        [0xc3, 0xa9],
        [0xe2, 0x82, 0xac],
        [0xf0, 0x9f, 0x98, 0x80],
        [0xed, 0xa0, 0x80],
        [0xc0, 0xaf],
        [0xff],
        [0x80],
        [0xf4, 0x90, 0x80, 0x80],
        [0xe2, 0x82],
      ];
      let invalid = 0;
      for (let n = 0; n < 3000; n++) {
        const bytes: number[] = [];
        const count = 1 + Math.floor(random() * 6);
        for (let i = 0; i < count; i++) bytes.push(...pieces[Math.floor(random() * pieces.length)]!);
        const body = Uint8Array.from(bytes);
        let decoded: string | null;
        try {
          decoded = reference.decode(body);
        } catch {
          decoded = null;
        }
        const result = parseMessage(body, 'mid', OPTIONS);
        const said = !result.ok && result.reason === 'invalid-utf8';
        expect(said, `bytes ${Buffer.from(body).toString('hex')}`).to.equal(decoded === null);
        if (decoded === null) invalid++;
      }
      expect(invalid).to.be.greaterThan(300);
    });

    it('still refuses a lone surrogate in the messageId property when the body has no escape', () => {
      const result = parseMessage(json({ changes: [{ sku: 'a', delta: 1 }] }), 'm-\ud800', OPTIONS);
      expect(expectBad(result).reason).to.equal('invalid-id');
      expect(expectBad(result).detail).to.include('surrogate');
    });

    it('reports the same first unsafe per-SKU sum when the total leaves the safe range before it', () => {
      // The total passes 2^53 at changes[1] (sums start being kept per SKU there); SKU a's own sum only at changes[3].
      const body = json({
        id: 'm-1',
        changes: [
          { sku: 'a', delta: MAX - 10 },
          { sku: 'b', delta: MAX },
          { sku: 'a', delta: 10 },
          { sku: 'a', delta: -1 },
        ],
      });
      const bad = expectBad(parseMessage(body, undefined, OPTIONS));
      expect(bad.reason).to.equal('unsafe-delta');
      expect(bad.detail).to.include('changes[3]').and.include('"a"');
    });
  });

  it('bounds per-SKU sums of |delta| so a type-filtered subset can never round (regression)', () => {
    const MAX = Number.MAX_SAFE_INTEGER;
    const body = Buffer.from(
      JSON.stringify({
        id: 'm-1',
        changes: [
          { sku: 'a', delta: MAX, type: 'sale' },
          { sku: 'a', delta: -2, type: 'audit' },
          { sku: 'a', delta: 2, type: 'sale' },
        ],
      }),
    );
    const result = parseMessage(body, undefined, { maxBytes: 65536 });
    expect(result.ok).to.equal(false);
    if (!result.ok) expect(result.reason).to.equal('unsafe-delta');
  });
});
