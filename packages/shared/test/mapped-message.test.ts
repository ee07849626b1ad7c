import { expect } from 'chai';
import { parseMappedMessage, type DeliveryProperties } from '../src/mapped-message.js';
import { parseMessageMapping, type MessageMapping } from '../src/message-mapping.js';
import { MESSAGE_LIMITS, parseGeneral, type ParseOptions, type ParseResult } from '../src/message.js';
import { deliveryParser } from '../src/delivery-parser.js';

const OPTIONS: ParseOptions = { maxBytes: 1 << 24 };
const MAX = Number.MAX_SAFE_INTEGER;

/** The example shape: a warehouse at the root, its lines each with a nested SKU, a quantity and a reason; the id in the body or a header. */
const FOREIGN = parseMessageMapping(
  'TALLY_MESSAGE_MAPPING',
  JSON.stringify({
    id: ['/eventId', 'header:x-event-id'],
    changes: '/lines',
    sku: ['/warehouse', '0/product/sku'],
    skuSeparator: ':',
    delta: '0/qty',
    type: '0/reason',
  }),
);
/** Keys that need RFC 6901 escapes, a change as a [sku, delta] pair, the messageId property as the fallback id. */
const ESCAPED = parseMessageMapping(
  'TALLY_MESSAGE_MAPPING',
  JSON.stringify({ id: ['/meta/id~1v2', 'messageId'], changes: '/data/a~0b', sku: '0/0', delta: '0/1', type: '/meta/kind' }),
);

function seeded(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1103515245) + 12345) >>> 0;
    return state / 2 ** 32;
  };
}

/**
 * The reference, written apart from the code under test: decode with a fatal
 * TextDecoder, JSON.parse, resolve the pointers by a naive walk, rewrite the
 * body into the contract's shape, and let the contract's general path
 * (message.ts, itself tested against 65 bad inputs) decide it. The mapped
 * parse must give the same message, or the same reason code.
 */
function reference(body: Buffer, properties: DeliveryProperties, mapping: MessageMapping): ParseResult | { ok: false; reason: string } {
  if (body.length === 0) return { ok: false, reason: 'empty-body' };
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
  } catch {
    return { ok: false, reason: 'invalid-utf8' };
  }
  let root: unknown;
  try {
    root = JSON.parse(text);
  } catch {
    return { ok: false, reason: 'malformed-json' };
  }
  if (root === null || typeof root !== 'object' || Array.isArray(root)) return parseGeneral(Buffer.from(JSON.stringify(root)), undefined);
  const walk = (from: unknown, tokens: readonly string[]): unknown => {
    let value = from;
    for (const token of tokens) {
      if (Array.isArray(value)) value = /^(0|[1-9][0-9]*)$/.test(token) && Number(token) < value.length ? value[Number(token)] : undefined;
      else if (value !== null && typeof value === 'object')
        value = Object.prototype.hasOwnProperty.call(value, token) ? (value as Record<string, unknown>)[token] : undefined;
      else value = undefined;
      if (value === undefined) return undefined;
    }
    return value;
  };
  const rewritten: Record<string, unknown> = {};
  for (const source of mapping.ids) {
    const value =
      source.kind === 'body'
        ? walk(root, source.tokens)
        : source.kind === 'header'
          ? properties.headers?.[source.name]
          : properties.messageId === null || properties.messageId === ''
            ? undefined
            : properties.messageId;
    if (value !== undefined) {
      rewritten.id = value;
      break;
    }
  }
  const changes = walk(root, mapping.changes.tokens);
  if (changes !== undefined) {
    rewritten.changes = !Array.isArray(changes)
      ? changes
      : changes.map((change: unknown) => {
          if (change === null || typeof change !== 'object') return change;
          const read = (path: { from: string; tokens: readonly string[] }) => walk(path.from === 'body' ? root : change, path.tokens);
          const parts = mapping.sku.map(read);
          // A part the contract would refuse as a SKU is handed over alone, so the contract refuses it.
          const badPart = parts.findIndex(
            (part) => typeof part !== 'string' || part === '' || part.length > MESSAGE_LIMITS.maxSkuLength || /\p{Cs}/u.test(part),
          );
          const ambiguous = parts.slice(0, -1).some((part) => typeof part === 'string' && part.includes(mapping.skuSeparator) && mapping.sku.length > 1);
          const firstBad = badPart === -1 ? (ambiguous ? null : undefined) : parts[badPart];
          const sku = badPart === -1 && !ambiguous ? parts.join(mapping.skuSeparator) : firstBad;
          const out: Record<string, unknown> = { sku, delta: read(mapping.delta) };
          if (mapping.type !== null) out.type = read(mapping.type);
          return out;
        });
  }
  // JSON.stringify escapes lone surrogates, so the general path sees them as a body escape would show them.
  return parseGeneral(Buffer.from(JSON.stringify(rewritten)), undefined);
}

function expectAsReference(body: Buffer, properties: DeliveryProperties, mapping: MessageMapping): ParseResult {
  const mapped = parseMappedMessage(body, properties, mapping, OPTIONS);
  const expected = reference(body, properties, mapping);
  const where = `body ${JSON.stringify(body.toString('latin1').slice(0, 300))} ${JSON.stringify(properties)}`;
  if (expected.ok) expect(mapped, where).to.deep.equal(expected);
  else {
    expect(mapped.ok, where).to.equal(false);
    expect((mapped as { reason: string }).reason, `${where}: ${(mapped as { detail?: string }).detail}`).to.equal(expected.reason);
  }
  return mapped;
}

const ALPHABET = 'ABCDEFGH-12345:/~ é';

function randomText(random: () => number, max: number): string {
  let text = '';
  const length = Math.floor(random() * max);
  for (let i = 0; i < length; i++) text += ALPHABET[Math.floor(random() * ALPHABET.length)];
  return text;
}

/** A value of any JSON type, hostile more often than not. */
function randomValue(random: () => number): unknown {
  const roll = random();
  if (roll < 0.15) return null;
  if (roll < 0.25) return random() < 0.5;
  if (roll < 0.35) return (random() - 0.5) * 100;
  if (roll < 0.45) return [randomText(random, 5)];
  if (roll < 0.55) return { x: 1 };
  if (roll < 0.6) return 'x'.repeat(250 + Math.floor(random() * 20));
  if (roll < 0.65) return '';
  return randomText(random, 8);
}

function randomDelta(random: () => number): unknown {
  const roll = random();
  if (roll < 0.05) return String(Math.floor(random() * 9));
  if (roll < 0.1) return 1.5;
  if (roll < 0.15) return (random() < 0.5 ? 1 : -1) * (MAX - Math.floor(random() * 3));
  if (roll < 0.18) return 2 ** 60;
  if (roll < 0.22) return randomValue(random);
  if (roll < 0.3) return 0;
  return Math.floor(random() * 21) - 10;
}

/** Mostly well-formed; a field is left out or replaced by a hostile value now and then. */
function randomForeignBody(random: () => number): { body: Buffer; properties: DeliveryProperties } {
  const sometimes = (p: number) => random() < p;
  const lines = Array.from({ length: Math.floor(random() * 8) }, () => {
    if (sometimes(0.03)) return randomValue(random);
    const line: Record<string, unknown> = {};
    if (!sometimes(0.04)) line.product = sometimes(0.04) ? randomValue(random) : { sku: sometimes(0.05) ? randomValue(random) : `A-${randomText(random, 6)}` };
    if (!sometimes(0.03)) line.qty = randomDelta(random);
    if (!sometimes(0.3)) line.reason = sometimes(0.05) ? randomValue(random) : ['sale', 'return', 'restock'][Math.floor(random() * 3)];
    if (sometimes(0.1)) line.note = randomText(random, 10);
    return line;
  });
  const message: Record<string, unknown> = {};
  const headerId = sometimes(0.2);
  if (!headerId && !sometimes(0.03)) message.eventId = sometimes(0.04) ? randomValue(random) : `e-${randomText(random, 12)}`;
  if (!sometimes(0.03)) message.warehouse = sometimes(0.05) ? randomValue(random) : `WH${Math.floor(random() * 5)}`;
  if (!sometimes(0.02)) message.lines = sometimes(0.03) ? randomValue(random) : lines;
  if (sometimes(0.1)) message.__proto__ = { eventId: 'not-own' };
  const headers: Record<string, unknown> = {};
  if (headerId) headers['x-event-id'] = sometimes(0.05) ? randomValue(random) : `h-${randomText(random, 10)}`;
  return { body: Buffer.from(JSON.stringify(message)), properties: { messageId: sometimes(0.2) ? 'property-id' : undefined, headers } };
}

function randomEscapedBody(random: () => number): { body: Buffer; properties: DeliveryProperties } {
  const items = Array.from({ length: Math.floor(random() * 6) }, () =>
    random() < 0.05 ? randomValue(random) : [random() < 0.05 ? randomValue(random) : `S${randomText(random, 4)}`, randomDelta(random)],
  );
  const meta: Record<string, unknown> = random() < 0.8 ? { 'id/v2': `m-${randomText(random, 8)}` } : {};
  if (random() < 0.5) meta.kind = random() < 0.1 ? randomValue(random) : 'sale';
  return { body: Buffer.from(JSON.stringify({ meta, data: { 'a~b': items } })), properties: { messageId: random() < 0.5 ? 'from-property' : '' } };
}

/** A byte replaced, inserted, removed, or the body cut: the hostile end of the corpus. */
function mutate(random: () => number, body: Buffer): Buffer {
  const bytes = [...body];
  const alphabet = Buffer.from('{}[]":,-0123456789.eE \\u/~');
  const extra = [0x80, 0xff, 0xc3, 0x00, 0x1f, 0x7f];
  for (let e = 1 + Math.floor(random() * 3); e > 0 && bytes.length > 0; e--) {
    const at = Math.floor(random() * bytes.length);
    const byte = random() < 0.9 ? alphabet[Math.floor(random() * alphabet.length)]! : extra[Math.floor(random() * extra.length)]!;
    const kind = random();
    if (kind < 0.4) bytes[at] = byte;
    else if (kind < 0.7) bytes.splice(at, 0, byte);
    else if (kind < 0.9) bytes.splice(at, 1);
    else bytes.length = at;
  }
  return Buffer.from(bytes);
}

function detailOf(result: ParseResult): string {
  expect(result.ok, JSON.stringify(result)).to.equal(false);
  const { reason, detail } = result as { reason: string; detail: string };
  return `${reason}: ${detail}`;
}

function foreign(message: unknown, headers: Record<string, unknown> = {}, messageId?: string): ParseResult {
  return parseMappedMessage(Buffer.from(JSON.stringify(message)), { headers, messageId }, FOREIGN, OPTIONS);
}

describe('parseMappedMessage (a declared mapping)', () => {
  it('counts the example as WH3:A-1, with its type', () => {
    const result = foreign({ eventId: 'e-81', warehouse: 'WH3', lines: [{ product: { sku: 'A-1' }, qty: -2, reason: 'sale' }] });
    expect(result).to.deep.equal({ ok: true, message: { id: 'e-81', changes: [{ sku: 'WH3:A-1', delta: -2, type: 'sale' }] } });
  });

  it('takes the id from the header when the body has none, and the body first when both have one', () => {
    const line = { product: { sku: 'A-1' }, qty: 1 };
    expect(foreign({ warehouse: 'W', lines: [line] }, { 'x-event-id': 'from-header' })).to.deep.include({ ok: true });
    expect((foreign({ warehouse: 'W', lines: [line] }, { 'x-event-id': 'h' }) as { message: { id: string } }).message.id).to.equal('h');
    expect((foreign({ eventId: 'b', warehouse: 'W', lines: [line] }, { 'x-event-id': 'h' }) as { message: { id: string } }).message.id).to.equal('b');
  });

  // The reason names the mapped place, where the contract's shape would say changes[3].delta.
  const details: Array<[string, unknown, Record<string, unknown>, string]> = [
    [
      'a string quantity',
      {
        eventId: 'e',
        warehouse: 'W',
        lines: [1, 2, 3].map(() => ({ product: { sku: 'A' }, qty: 1 })).concat([{ product: { sku: 'A' }, qty: '2' as unknown as number }]),
      },
      {},
      'invalid-delta: /lines/3/qty must be an integer, got "2"',
    ],
    ['no id anywhere', { warehouse: 'W', lines: [] }, {}, 'missing-id: no /eventId and no header x-event-id'],
    ['lines as an object', { eventId: 'e', warehouse: 'W', lines: { product: { sku: 'A' }, qty: 1 } }, {}, 'changes-not-array: /lines is an object'],
    ['no lines', { eventId: 'e', warehouse: 'W' }, {}, 'missing-changes: no /lines'],
    ['a numeric id', { eventId: 81, lines: [] }, {}, 'invalid-id: /eventId must be a string, got 81'],
    ['a numeric header id', { lines: [] }, { 'x-event-id': 81 }, 'invalid-id: header x-event-id must be a string, got 81'],
    ['no warehouse', { eventId: 'e', lines: [{ product: { sku: 'A' }, qty: 1 }] }, {}, 'invalid-sku: /warehouse is missing'],
    ['no product', { eventId: 'e', warehouse: 'W', lines: [{ qty: 1 }] }, {}, 'invalid-sku: /lines/0/product/sku is missing'],
    ['an empty SKU', { eventId: 'e', warehouse: 'W', lines: [{ product: { sku: '' }, qty: 1 }] }, {}, 'invalid-sku: /lines/0/product/sku must not be empty'],
    [
      'the separator inside the warehouse',
      { eventId: 'e', warehouse: 'W:1', lines: [{ product: { sku: 'A' }, qty: 1 }] },
      {},
      'invalid-sku: /warehouse "W:1" contains the separator ":", so the joined SKU would be ambiguous',
    ],
    [
      'a joined SKU past 256',
      { eventId: 'e', warehouse: 'W'.repeat(200), lines: [{ product: { sku: 'A'.repeat(56) }, qty: 1 }] },
      {},
      'invalid-sku: /warehouse + /lines/0/product/sku joined is 257 characters, the limit is 256',
    ],
    ['no quantity', { eventId: 'e', warehouse: 'W', lines: [{ product: { sku: 'A' } }] }, {}, 'invalid-delta: /lines/0/qty is missing'],
    [
      'a quantity past 2^53',
      { eventId: 'e', warehouse: 'W', lines: [{ product: { sku: 'A' }, qty: 2 ** 60 }] },
      {},
      `unsafe-delta: /lines/0/qty ${2 ** 60} is outside ±${MAX}`,
    ],
    [
      'one SKU summing past 2^53',
      {
        eventId: 'e',
        warehouse: 'W',
        lines: [
          { product: { sku: 'A' }, qty: MAX },
          { product: { sku: 'A' }, qty: -1 },
        ],
      },
      {},
      `unsafe-delta: the deltas for /warehouse + /lines/1/product/sku "W:A" add up (in absolute value) beyond ${MAX}`,
    ],
    [
      'a numeric reason',
      { eventId: 'e', warehouse: 'W', lines: [{ product: { sku: 'A' }, qty: 1, reason: 7 }] },
      {},
      'invalid-type: /lines/0/reason must be a string, got 7',
    ],
    ['a line that is a number', { eventId: 'e', warehouse: 'W', lines: [5] }, {}, 'invalid-change: /lines/0 must be an object, got 5'],
    ['an array body', ['e'], {}, 'not-an-object: the body must be a JSON object, got an array'],
  ];
  for (const [what, message, headers, wanted] of details) {
    it(`dead-letters ${what} as ${wanted.split(':')[0]}, naming the mapped path`, () => {
      expect(detailOf(foreign(message, headers))).to.equal(wanted);
    });
  }

  it('refuses a lone surrogate in a mapped SKU or id, as the contract does', () => {
    const body = (sku: string, id = 'e') => Buffer.from(`{"eventId":"${id}","warehouse":"W","lines":[{"product":{"sku":"${sku}"},"qty":1}]}`);
    expect(detailOf(parseMappedMessage(body('A\\ud800'), {}, FOREIGN, OPTIONS))).to.match(/^invalid-sku: \/lines\/0\/product\/sku contains a lone surrogate/);
    expect(detailOf(parseMappedMessage(body('A', 'e\\udc00'), {}, FOREIGN, OPTIONS))).to.match(/^invalid-id: \/eventId contains a lone surrogate/);
    expect(detailOf(parseMappedMessage(Buffer.from('{"lines":[]}'), { headers: { 'x-event-id': 'h\ud800' } }, FOREIGN, OPTIONS))).to.match(
      /^invalid-id: header x-event-id contains a lone surrogate/,
    );
  });

  it('keeps the size limit, the UTF-8 check and the JSON errors of the contract', () => {
    expect(detailOf(parseMappedMessage(Buffer.alloc(0), {}, FOREIGN, OPTIONS))).to.match(/^empty-body/);
    expect(detailOf(parseMappedMessage(Buffer.from('{"eventId":"e"}'), {}, FOREIGN, { maxBytes: 10 }))).to.equal(
      'oversized-body: the body is 15 bytes, the limit is 10',
    );
    expect(detailOf(parseMappedMessage(Buffer.from([0x7b, 0xc3, 0x28, 0x7d]), {}, FOREIGN, OPTIONS))).to.match(/^invalid-utf8/);
    expect(detailOf(parseMappedMessage(Buffer.from('{"eventId":'), {}, FOREIGN, OPTIONS))).to.match(/^malformed-json: /);
    const many = { eventId: 'e', warehouse: 'W', lines: Array.from({ length: MESSAGE_LIMITS.maxChanges + 1 }, () => ({ product: { sku: 'A' }, qty: 1 })) };
    expect(detailOf(foreign(many))).to.equal(
      `too-many-changes: /lines has ${MESSAGE_LIMITS.maxChanges + 1} entries, the limit is ${MESSAGE_LIMITS.maxChanges}`,
    );
  });

  it('returns a reason for 100k nested arrays where the lines should be, and does not throw', () => {
    const body = Buffer.from(`{"eventId":"e","warehouse":"W","lines":[${'['.repeat(100_000)}${']'.repeat(100_000)}]}`);
    expect(detailOf(parseMappedMessage(body, {}, FOREIGN, OPTIONS))).to.equal('invalid-sku: /lines/0/product/sku is missing');
    const deep = Buffer.from(`{"eventId":"e","lines":${'{"a":'.repeat(100_000)}1${'}'.repeat(100_000)}}`);
    expect(detailOf(parseMappedMessage(deep, {}, FOREIGN, OPTIONS))).to.equal('changes-not-array: /lines is an object');
  });

  it('reads keys that need RFC 6901 escapes, [sku, delta] pairs and a type from the root', () => {
    const body = Buffer.from(
      JSON.stringify({
        meta: { 'id/v2': 'm-1', kind: 'sale' },
        data: {
          'a~b': [
            ['S1', 2],
            ['S2', -1],
          ],
        },
      }),
    );
    expect(parseMappedMessage(body, {}, ESCAPED, OPTIONS)).to.deep.equal({
      ok: true,
      message: {
        id: 'm-1',
        changes: [
          { sku: 'S1', delta: 2, type: 'sale' },
          { sku: 'S2', delta: -1, type: 'sale' },
        ],
      },
    });
    const noId = Buffer.from(JSON.stringify({ data: { 'a~b': [['S1', '2']] } }));
    expect(detailOf(parseMappedMessage(noId, { messageId: '' }, ESCAPED, OPTIONS))).to.equal('missing-id: no /meta/id~1v2 and no messageId property');
    expect(detailOf(parseMappedMessage(noId, { messageId: 'p' }, ESCAPED, OPTIONS))).to.equal('invalid-delta: /data/a~0b/0/1 must be an integer, got "2"');
  });

  it('agrees with the JSON.parse reference on 5,000 random bodies of the example shape', () => {
    const random = seeded(0x5eed);
    let good = 0;
    for (let n = 0; n < 5_000; n++) {
      const { body, properties } = randomForeignBody(random);
      if (expectAsReference(body, properties, FOREIGN).ok) good++;
    }
    // Most are good, and enough are bad to reach every check.
    expect(good).to.be.within(1_500, 4_500);
  });

  it('agrees with the reference on 3,000 random bodies of a shape with escaped keys and [sku, delta] pairs', () => {
    const random = seeded(0xe5c);
    let good = 0;
    for (let n = 0; n < 3_000; n++) {
      const { body, properties } = randomEscapedBody(random);
      if (expectAsReference(body, properties, ESCAPED).ok) good++;
    }
    expect(good).to.be.within(500, 2_900);
  });

  it('agrees with the reference on 20,000 mutated bodies (a byte replaced, inserted, removed or cut)', () => {
    const random = seeded(0xbad);
    const reasons = new Set<string>();
    for (let n = 0; n < 20_000; n++) {
      const { body, properties } = randomForeignBody(random);
      const result = expectAsReference(mutate(random, body), properties, FOREIGN);
      reasons.add(result.ok ? 'ok' : result.reason);
    }
    for (const reason of ['ok', 'malformed-json', 'invalid-utf8', 'invalid-sku', 'invalid-delta', 'missing-id', 'invalid-id'])
      expect([...reasons]).to.include(reason);
  });

  it('is what the daemon runs when a mapping is declared, and the contract shape when not', () => {
    const body = Buffer.from(JSON.stringify({ eventId: 'e', warehouse: 'W', lines: [{ product: { sku: 'A' }, qty: 1 }] }));
    expect(deliveryParser(FOREIGN, OPTIONS)(body, {}).ok).to.equal(true);
    expect(detailOf(deliveryParser(null, OPTIONS)(body, {}))).to.match(/^missing-id/);
    const contract = Buffer.from('{"changes":[{"sku":"A","delta":1}]}');
    expect(deliveryParser(null, OPTIONS)(contract, { messageId: 'p' })).to.deep.equal({ ok: true, message: { id: 'p', changes: [{ sku: 'A', delta: 1 }] } });
  });
});
