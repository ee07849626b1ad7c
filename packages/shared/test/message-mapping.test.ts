import { expect } from 'chai';
import { loadConfig } from '../src/config.js';
import { ConfigError } from '../src/errors.js';
import { parseMessageMapping } from '../src/message-mapping.js';

const VARIABLE = 'TALLY_MESSAGE_MAPPING';
const EXAMPLE = {
  id: ['/eventId', 'header:x-event-id'],
  changes: '/lines',
  sku: ['/warehouse', '0/product/sku'],
  skuSeparator: ':',
  delta: '0/qty',
  type: '0/reason',
};

function refusal(declaration: unknown): ConfigError {
  const text = typeof declaration === 'string' ? declaration : JSON.stringify(declaration);
  try {
    loadConfig({ [VARIABLE]: text });
  } catch (error) {
    expect(error, text).to.be.instanceOf(ConfigError);
    expect((error as ConfigError).code).to.equal('TALLY_CONFIG_INVALID');
    expect((error as ConfigError).variable).to.equal(VARIABLE);
    return error as ConfigError;
  }
  return expect.fail(`expected ${text} to be refused`);
}

describe('TALLY_MESSAGE_MAPPING (the declaration)', () => {
  it('is off by default: the contract shape', () => {
    expect(loadConfig({}).messageMapping).to.equal(null);
    expect(loadConfig({ [VARIABLE]: '  ' }).messageMapping).to.equal(null);
  });

  it('reads the example: id sources in order, absolute and relative paths, the separator, the type', () => {
    const mapping = loadConfig({ [VARIABLE]: JSON.stringify(EXAMPLE) }).messageMapping!;
    expect(mapping.ids).to.deep.equal([
      { kind: 'body', tokens: ['eventId'], label: '/eventId' },
      { kind: 'header', name: 'x-event-id', label: 'header x-event-id' },
    ]);
    expect(mapping.changes).to.deep.equal({ tokens: ['lines'], text: '/lines' });
    expect(mapping.sku).to.deep.equal([
      { from: 'body', tokens: ['warehouse'], text: '/warehouse' },
      { from: 'change', tokens: ['product', 'sku'], text: '/product/sku' },
    ]);
    expect(mapping.skuSeparator).to.equal(':');
    expect(mapping.delta).to.deep.equal({ from: 'change', tokens: ['qty'], text: '/qty' });
    expect(mapping.type).to.deep.equal({ from: 'change', tokens: ['reason'], text: '/reason' });
    expect(JSON.parse(mapping.declared)).to.deep.equal(EXAMPLE);
    expect(Object.isFrozen(mapping)).to.equal(true);
  });

  it('takes single strings for id and sku, the messageId property, no type, and RFC 6901 escapes', () => {
    const mapping = parseMessageMapping(VARIABLE, JSON.stringify({ id: 'messageId', changes: '/a~1b/items', sku: '0/code~0x', delta: '0/n' }));
    expect(mapping.ids).to.deep.equal([{ kind: 'messageId', label: 'messageId property' }]);
    expect(mapping.changes.tokens).to.deep.equal(['a/b', 'items']);
    expect(mapping.sku).to.deep.equal([{ from: 'change', tokens: ['code~x'], text: '/code~0x' }]);
    expect(mapping.skuSeparator).to.equal('');
    expect(mapping.type).to.equal(null);
  });

  // Each refusal names the key and says what is wrong; the code, not the text, is what callers branch on.
  const refused: Array<[string, unknown, RegExp]> = [
    ['not JSON', '{id: "/eventId"}', /not JSON/],
    ['not an object', '["/eventId"]', /expected a JSON object/],
    ['an unknown key', { ...EXAMPLE, skuSep: ':' }, /skuSep: unknown key/],
    ['no id', { ...EXAMPLE, id: undefined }, /id: missing/],
    ['no changes', { ...EXAMPLE, changes: undefined }, /changes: missing/],
    ['no sku', { ...EXAMPLE, sku: undefined }, /sku: missing/],
    ['no delta', { ...EXAMPLE, delta: undefined }, /delta: missing/],
    ['an id pointer without its slash', { ...EXAMPLE, id: 'eventId' }, /^TALLY_MESSAGE_MAPPING: id: expected a JSON Pointer/],
    ['a bad escape in the second id source', { ...EXAMPLE, id: ['header:x', '/event~2Id'] }, /id\[1\]: "~" must be followed by 0 or 1/],
    ['an empty header name', { ...EXAMPLE, id: 'header:' }, /id: a header name/],
    ['an empty id list', { ...EXAMPLE, id: [] }, /id: expected a string or a list/],
    ['a number for an id', { ...EXAMPLE, id: 7 }, /id: expected a string or a list/],
    ['five id sources', { ...EXAMPLE, id: ['/a', '/b', '/c', '/d', '/e'] }, /id: expected a string or a list of 1 to 4/],
    ['changes relative to a change', { ...EXAMPLE, changes: '0/lines' }, /changes: a JSON Pointer starts with "\/".*did you mean/],
    ['changes without its slash', { ...EXAMPLE, changes: 'lines' }, /changes: .*did you mean "\/lines"/],
    ['changes at the root', { ...EXAMPLE, changes: '' }, /changes: "" is the whole body/],
    ['changes as a list', { ...EXAMPLE, changes: ['/lines'] }, /changes: expected a JSON Pointer/],
    ['a sku path neither absolute nor relative', { ...EXAMPLE, sku: ['/warehouse', 'product/sku'] }, /sku\[1\]: expected a JSON Pointer .*"0\/product\/sku"/],
    ['a relative path that steps up', { ...EXAMPLE, delta: '1/qty' }, /delta: a path relative to the change starts with "0\/"/],
    ['the change itself', { ...EXAMPLE, delta: '0' }, /delta: "0" alone is the change itself/],
    ['a bad escape in a relative path', { ...EXAMPLE, type: '0/rea~son' }, /type: "~" must be followed by 0 or 1/],
    ['a type that is not a string', { ...EXAMPLE, type: 3 }, /type: expected a path/],
    ['several SKU paths and no separator', { ...EXAMPLE, skuSeparator: undefined }, /skuSeparator: missing; sku joins 2 paths/],
    ['an empty separator', { ...EXAMPLE, skuSeparator: '' }, /skuSeparator: expected a string of 1 to 16/],
    ['a separator that is not a string', { ...EXAMPLE, skuSeparator: 1 }, /skuSeparator: expected a string/],
    ['a separator longer than 16', { ...EXAMPLE, skuSeparator: '-'.repeat(17) }, /skuSeparator: expected a string of 1 to 16/],
    [
      'a separator with a lone surrogate',
      `{"id":"/i","changes":"/c","sku":["/w","0/s"],"skuSeparator":"\\ud800","delta":"0/q"}`,
      /skuSeparator: contains a lone surrogate/,
    ],
    ['a separator for one SKU path', { ...EXAMPLE, sku: '0/product/sku' }, /skuSeparator: only used when sku lists several paths/],
    ['five SKU paths', { ...EXAMPLE, sku: ['/a', '/b', '/c', '/d', '0/e'] }, /sku: expected a string or a list of 1 to 4/],
    [
      'sku and delta both from the root',
      { ...EXAMPLE, sku: ['/warehouse', '/sku'], delta: '/qty' },
      /delta: sku and delta are all read from the body's root.*"0\/qty"/,
    ],
  ];
  for (const [what, declaration, wording] of refused) {
    it(`refuses ${what}`, () => {
      const error = refusal(declaration);
      expect(error.message).to.match(/^TALLY_MESSAGE_MAPPING: /);
      expect(error.message).to.match(wording);
    });
  }

  it('accepts sku and delta from the root as long as one of them is read from the change', () => {
    expect(parseMessageMapping(VARIABLE, JSON.stringify({ ...EXAMPLE, delta: '/qty' })).delta.from).to.equal('body');
    expect(parseMessageMapping(VARIABLE, JSON.stringify({ ...EXAMPLE, sku: ['/warehouse', '/sku'] })).sku.every((p) => p.from === 'body')).to.equal(true);
  });
});
