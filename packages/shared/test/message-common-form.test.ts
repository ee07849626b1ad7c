import { expect } from 'chai';
import { readCommonForm } from '../src/message-common-form.js';
import { MESSAGE_LIMITS, parseGeneral, parseMessage, type ParseOptions } from '../src/message.js';

const OPTIONS: ParseOptions = { maxBytes: 1 << 24 };
const MAX = Number.MAX_SAFE_INTEGER;

function seeded(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    return state / 2 ** 32;
  };
}

/** parseMessage must decide every body exactly as the general path does; returns whether the common form read it. */
function expectSameAsGeneral(body: Buffer, messageId?: unknown): boolean {
  const fast = parseMessage(body, messageId, OPTIONS);
  const general = parseGeneral(body, messageId);
  expect(fast, `body ${JSON.stringify(body.toString('latin1'))}`).to.deep.equal(general);
  return readCommonForm(body, MESSAGE_LIMITS, messageId) !== null;
}

const PRINTABLE = ' !#$%&()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{|}~';

function randomText(random: () => number, max: number, alphabet = PRINTABLE): string {
  const length = Math.floor(random() * max);
  let text = '';
  for (let i = 0; i < length; i++) text += alphabet[Math.floor(random() * alphabet.length)];
  return text;
}

function randomDelta(random: () => number): number {
  const roll = random();
  if (roll < 0.1) return 0;
  if (roll < 0.2) return -Math.floor(random() * 1e6);
  if (roll < 0.3) return Math.floor(random() * 1e15) * (random() < 0.5 ? 1 : -1);
  if (roll < 0.35) return (random() < 0.5 ? 1 : -1) * (MAX - Math.floor(random() * 3));
  return 1 + Math.floor(random() * 20);
}

/** A message as a producer's JSON.stringify prints it: mostly the common form. */
function randomMessage(random: () => number): Buffer {
  const changes = Array.from({ length: Math.floor(random() * 10) }, () => {
    const change: Record<string, unknown> = { sku: `SKU-${randomText(random, 12)}`, delta: randomDelta(random) };
    if (random() < 0.3) change.type = randomText(random, 10);
    return change;
  });
  // One message in ten carries its id in the messageId property, as the bench's workload does.
  return Buffer.from(JSON.stringify(random() < 0.1 ? { changes } : { id: `m-${randomText(random, 40)}`, changes }));
}

describe('readCommonForm (the common form, read without JSON.parse)', () => {
  it('reads the usual body into what the general path returns', () => {
    const body = Buffer.from('{"id":"m-1","changes":[{"sku":"A-1","delta":5},{"sku":"B 2","delta":-3,"type":"sale"},{"sku":"A-1","delta":0}]}');
    expect(readCommonForm(body, MESSAGE_LIMITS, undefined)).to.deep.equal({
      id: 'm-1',
      changes: [
        { sku: 'A-1', delta: 5 },
        { sku: 'B 2', delta: -3, type: 'sale' },
        { sku: 'A-1', delta: 0 },
      ],
    });
    expect(expectSameAsGeneral(body)).to.equal(true);
  });

  it('keeps -0 as JSON.parse does, and leaves out the type key when there is none', () => {
    const message = readCommonForm(Buffer.from('{"id":"m","changes":[{"sku":"a","delta":-0}]}'), MESSAGE_LIMITS, undefined)!;
    expect(Object.is(message.changes[0]!.delta, -0)).to.equal(true);
    expect(Object.hasOwn(message.changes[0]!, 'type')).to.equal(false);
  });

  const declined: Array<[string, string]> = [
    ['whitespace', '{"id": "m","changes":[]}'],
    ['a trailing newline', '{"id":"m","changes":[]}\n'],
    ['keys in the other order', '{"changes":[],"id":"m"}'],
    ['an extra key', '{"id":"m","source":"x","changes":[]}'],
    ['an extra key in a change', '{"id":"m","changes":[{"sku":"a","delta":1,"note":"x"}]}'],
    ['a repeated key', '{"id":"m","changes":[{"sku":"a","delta":1,"delta":2}]}'],
    ['an escape', '{"id":"m\\u0041","changes":[]}'],
    ['a non-ASCII byte', '{"id":"café","changes":[]}'],
    ['a fraction', '{"id":"m","changes":[{"sku":"a","delta":1.0}]}'],
    ['an exponent', '{"id":"m","changes":[{"sku":"a","delta":2e3}]}'],
    ['a leading zero', '{"id":"m","changes":[{"sku":"a","delta":01}]}'],
    ['16 digits', '{"id":"m","changes":[{"sku":"a","delta":1234567890123456}]}'],
    ['a string delta', '{"id":"m","changes":[{"sku":"a","delta":"1"}]}'],
    ['an empty id', '{"id":"","changes":[]}'],
    ['an empty sku', '{"id":"m","changes":[{"sku":"","delta":1}]}'],
    ['a sum of |delta| past 2^53', `{"id":"m","changes":[{"sku":"a","delta":${MAX}},{"sku":"b","delta":-1}]}`],
    [
      'a per-SKU sum past 2^53 made of 15-digit deltas (unsafe-delta)',
      `{"id":"m","changes":[${new Array(10).fill('{"sku":"a","delta":999999999999999}').join(',')}]}`,
    ],
    ['a trailing comma', '{"id":"m","changes":[{"sku":"a","delta":1},]}'],
    ['a truncated body', '{"id":"m","changes":[{"sku":"a","delta":1}'],
    ['two documents', '{"id":"m","changes":[]}{"id":"n","changes":[]}'],
  ];
  for (const [what, text] of declined) {
    it(`leaves ${what} to the general path`, () => {
      expect(readCommonForm(Buffer.from(text), MESSAGE_LIMITS, 'from-property')).to.equal(null);
      expectSameAsGeneral(Buffer.from(text), 'from-property');
    });
  }

  it('takes the id from the messageId property when the body has none, only when the general path would', () => {
    const body = Buffer.from('{"changes":[{"sku":"a","delta":1}]}');
    expect(readCommonForm(body, MESSAGE_LIMITS, 'from-property')).to.deep.equal({ id: 'from-property', changes: [{ sku: 'a', delta: 1 }] });
    expect(expectSameAsGeneral(body, 'from-property')).to.equal(true);
    expect(expectSameAsGeneral(body, 'p'.repeat(MESSAGE_LIMITS.maxIdLength))).to.equal(true);
    for (const property of [undefined, null, '', 42, Buffer.from('m'), 'p'.repeat(MESSAGE_LIMITS.maxIdLength + 1), 'm-\ud800', 'caf\u00e9 \ud83d\ude00']) {
      const general = parseGeneral(body, property);
      expect(parseMessage(body, property, OPTIONS), String(property)).to.deep.equal(general);
    }
    // Non-ASCII but well-formed: the general path takes it, and so does the common form (it is not from the body).
    expect(expectSameAsGeneral(body, 'caf\u00e9 \ud83d\ude00')).to.equal(true);
    for (const property of [undefined, '', 'm-\ud800']) expect(readCommonForm(body, MESSAGE_LIMITS, property)).to.equal(null);
  });

  it('reads values at their limits and leaves the ones past them to the general path (same reason)', () => {
    const at = (id: string, sku: string, type: string) => Buffer.from(JSON.stringify({ id, changes: [{ sku, delta: 1, type }] }));
    const { maxIdLength: i, maxSkuLength: s, maxTypeLength: t } = MESSAGE_LIMITS;
    expect(expectSameAsGeneral(at('i'.repeat(i), 's'.repeat(s), 't'.repeat(t)))).to.equal(true);
    expect(expectSameAsGeneral(at('i'.repeat(i), 's'.repeat(s), ''))).to.equal(true);
    for (const body of [at('i'.repeat(i + 1), 's', 't'), at('i', 's'.repeat(s + 1), 't'), at('i', 's', 't'.repeat(t + 1))]) {
      expect(expectSameAsGeneral(body)).to.equal(false);
      expect(parseMessage(body, undefined, OPTIONS).ok).to.equal(false);
    }
    const changes = (n: number) => Buffer.from(JSON.stringify({ id: 'm', changes: Array.from({ length: n }, () => ({ sku: 'a', delta: 1 })) }));
    expect(expectSameAsGeneral(changes(MESSAGE_LIMITS.maxChanges))).to.equal(true);
    expect(expectSameAsGeneral(changes(MESSAGE_LIMITS.maxChanges + 1))).to.equal(false);
    expect(expectSameAsGeneral(Buffer.from(`{"id":"m","changes":[{"sku":"a","delta":${10 ** 15 - 1}}]}`))).to.equal(true);
  });

  it('agrees with the general path on 3,000 random messages, most of them read in the common form', () => {
    const random = seeded(0xc0ffee);
    let read = 0;
    for (let n = 0; n < 3_000; n++) if (expectSameAsGeneral(randomMessage(random), random() < 0.5 ? undefined : 'prop')) read++;
    expect(read).to.be.greaterThan(2_000);
  });

  it('agrees with the general path on 20,000 mutated bodies (a byte replaced, inserted, removed or cut)', () => {
    const random = seeded(0xbadbee);
    const alphabet = Buffer.from('{}[]":,-0123456789.eE \\uidchangesskudeltatype');
    const extra = [0x80, 0xff, 0xc3, 0x00, 0x1f, 0x7f];
    let read = 0;
    let accepted = 0;
    for (let n = 0; n < 20_000; n++) {
      const bytes = [...randomMessage(random)];
      const edits = 1 + Math.floor(random() * 3);
      for (let e = 0; e < edits && bytes.length > 0; e++) {
        const at = Math.floor(random() * bytes.length);
        const byte = random() < 0.9 ? alphabet[Math.floor(random() * alphabet.length)]! : extra[Math.floor(random() * extra.length)]!;
        const kind = random();
        if (kind < 0.4) bytes[at] = byte;
        else if (kind < 0.7) bytes.splice(at, 0, byte);
        else if (kind < 0.9) bytes.splice(at, 1);
        else bytes.length = at;
      }
      const body = Buffer.from(bytes);
      if (body.length === 0) continue;
      if (expectSameAsGeneral(body, random() < 0.5 ? undefined : 'prop')) read++;
      if (parseMessage(body, undefined, OPTIONS).ok) accepted++;
    }
    // Mutations that keep the common form (a digit, a letter in a string) are read by it, and must agree too.
    expect(read).to.be.greaterThan(1_000);
    expect(accepted).to.be.greaterThan(read);
  });
});
