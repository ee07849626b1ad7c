import { expect } from 'chai';
import { formatJsonPointer, parseJsonPointer, resolvePointer } from '../src/json-pointer.js';

function tokens(text: string): readonly string[] {
  const syntax = parseJsonPointer(text);
  if (!syntax.ok) return expect.fail(`${text}: ${syntax.problem}`);
  return syntax.tokens;
}

describe('JSON Pointer (RFC 6901)', () => {
  // The example document and pointers of RFC 6901 section 5.
  const rfc = JSON.parse('{"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\\\j": 5, "k\\"l": 6, " ": 7, "m~n": 8}') as unknown;
  const cases: Array<[string, unknown]> = [
    ['', rfc],
    ['/foo', ['bar', 'baz']],
    ['/foo/0', 'bar'],
    ['/', 0],
    ['/a~1b', 1],
    ['/c%d', 2],
    ['/e^f', 3],
    ['/g|h', 4],
    ['/i\\j', 5],
    ['/k"l', 6],
    ['/ ', 7],
    ['/m~0n', 8],
  ];
  for (const [pointer, value] of cases) {
    it(`resolves ${JSON.stringify(pointer)} as the RFC's example does`, () => {
      expect(resolvePointer(rfc, tokens(pointer))).to.deep.equal(value);
    });
  }

  it('unescapes ~01 to "~1", not "/" (~1 is replaced first)', () => {
    expect(tokens('/~01')).to.deep.equal(['~1']);
    expect(tokens('/a~1~0b')).to.deep.equal(['a/~b']);
  });

  it('formats tokens back into the pointer they came from', () => {
    for (const text of ['', '/', '/a~1b', '/m~0n', '/~01', '/a/b/0', '//x', '/a~1~0b']) expect(formatJsonPointer(tokens(text))).to.equal(text);
  });

  it('refuses a pointer that does not start with "/" and a "~" not followed by 0 or 1', () => {
    for (const text of ['foo', '0/foo', '#/foo', '/a~2', '/a~', '/~x/b', '/ok/~']) expect(parseJsonPointer(text).ok, text).to.equal(false);
  });

  it('addresses array elements by decimal index only, and nothing past the end or through a scalar', () => {
    const doc = { list: [10, 20, { x: 1 }], s: 'text', n: 5 };
    expect(resolvePointer(doc, tokens('/list/1'))).to.equal(20);
    expect(resolvePointer(doc, tokens('/list/2/x'))).to.equal(1);
    for (const pointer of ['/list/01', '/list/-', '/list/3', '/list/1.0', '/list/-1', '/list/ 1', '/s/0', '/s/length', '/n/x', '/missing', '/list/2/y']) {
      expect(resolvePointer(doc, tokens(pointer)), pointer).to.equal(undefined);
    }
  });

  it('reads own members only: "__proto__", "constructor" and "toString" never reach Object.prototype', () => {
    const doc = JSON.parse('{"__proto__": {"sku": "own"}, "a": {}}') as unknown;
    expect(resolvePointer(doc, tokens('/__proto__/sku'))).to.equal('own');
    for (const pointer of ['/constructor', '/a/toString', '/a/__proto__', '/a/hasOwnProperty', '/list/length'])
      expect(resolvePointer(doc, tokens(pointer)), pointer).to.equal(undefined);
    expect(resolvePointer([1, 2], tokens('/length'))).to.equal(undefined);
  });
});
