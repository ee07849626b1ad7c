import { expect } from 'chai';
import {
  countKey,
  countScanPattern,
  escapeGlob,
  layoutKey,
  legacyMarkerKey,
  legacyMarkerScanPattern,
  markerScanPattern,
  receiptKey,
  skuOfCountKey,
  statsKey,
} from '../src/keys.js';
import { markerBucketKey } from '../src/markers.js';

/** Redis Cluster's hash tag rule: the text between the first '{' and the first '}' after it, if non-empty. */
function hashTag(key: string): string | null {
  const open = key.indexOf('{');
  if (open < 0) return null;
  const close = key.indexOf('}', open + 1);
  if (close < 0 || close === open + 1) return null;
  return key.slice(open + 1, close);
}

/** Redis glob (as used by SCAN MATCH) to a RegExp: *, ?, [...] and backslash escapes. */
function globToRegExp(glob: string): RegExp {
  let out = '';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === '\\' && i + 1 < glob.length) {
      out += glob[++i]!.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
    } else if (c === '*') {
      out += '[\\s\\S]*';
    } else if (c === '?') {
      out += '[\\s\\S]';
    } else if (c === '[') {
      const end = glob.indexOf(']', i + 1);
      out += `[${glob.slice(i + 1, end).replace(/\\/g, '\\\\')}]`;
      i = end;
    } else {
      out += c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
    }
  }
  return new RegExp(`^${out}$`, 'u');
}

const PREFIXES = ['tally:', 't', 'prod.eu-1_tally:', 'a:b:c:'];
const VSHARDS = [0, 1, 7, 15, 1023];
const TRICKY_SKUS = [
  'plain',
  'with}brace',
  'with{brace',
  '{7}',
  '}:',
  '}:{3}:x',
  'a:b:c',
  ':leading',
  'trailing:',
  'with space',
  '  ',
  'café',
  '商品',
  '😀-emoji',
  '*?[]\\',
  'c:{1}:nested',
  '\n\t',
];

describe('key layout', () => {
  it('writes the documented layout', () => {
    expect(countKey('tally:', 3, 'SKU-1')).to.equal('tally:c:{3}:SKU-1');
    expect(legacyMarkerKey('tally:', 3, 'msg-1')).to.equal('tally:m:{3}:msg-1');
    expect(markerBucketKey('tally:', 3, 2891234, 17)).to.equal('tally:mk:{3}:2891234:17');
    expect(receiptKey('tally:', 3, 'b-1')).to.equal('tally:w:{3}:b-1');
    expect(statsKey('tally:')).to.equal('tally:stats');
    expect(layoutKey('tally:')).to.equal('tally:layout');
  });

  it('puts the virtual shard in the hash tag of every shard key, whatever the SKU or id', () => {
    for (const prefix of PREFIXES) {
      for (const vshard of VSHARDS) {
        for (const text of TRICKY_SKUS) {
          for (const key of [
            countKey(prefix, vshard, text),
            legacyMarkerKey(prefix, vshard, text),
            markerBucketKey(prefix, vshard, 9, 3),
            receiptKey(prefix, vshard, text),
          ]) {
            expect(key.startsWith(prefix), key).to.equal(true);
            expect(hashTag(key), key).to.equal(String(vshard));
          }
        }
      }
    }
  });

  it('keeps counts, markers and receipts apart', () => {
    const keys = new Set([
      countKey('tally:', 1, 'x'),
      legacyMarkerKey('tally:', 1, 'x'),
      markerBucketKey('tally:', 1, 1, 1),
      receiptKey('tally:', 1, 'x'),
      statsKey('tally:'),
      layoutKey('tally:'),
    ]);
    expect(keys.size).to.equal(6);
  });

  it('skuOfCountKey round-trips SKUs containing }, :, {, spaces and unicode', () => {
    for (const prefix of PREFIXES) {
      for (const vshard of VSHARDS) {
        for (const sku of TRICKY_SKUS) {
          expect(skuOfCountKey(prefix, countKey(prefix, vshard, sku)), `${prefix} ${vshard} ${JSON.stringify(sku)}`).to.equal(sku);
        }
      }
    }
  });

  it('skuOfCountKey returns null for keys that are not count keys of the prefix', () => {
    const notCounts = [
      legacyMarkerKey('tally:', 1, 'm'),
      markerBucketKey('tally:', 1, 5, 7),
      receiptKey('tally:', 1, 'b'),
      statsKey('tally:'),
      layoutKey('tally:'),
      countKey('other:', 1, 'sku'),
      'tally:c:{x}:sku',
      'tally:c:{}:sku',
      'tally:c:{-1}:sku',
      'tally:c:{1.5}:sku',
      'tally:c:{3}sku',
      'tally:c:{3',
      'tally:c:3:sku',
      'tally:c:',
      '',
    ];
    for (const key of notCounts) expect(skuOfCountKey('tally:', key), key).to.equal(null);
  });

  it('skuOfCountKey accepts an empty SKU after a well-formed head', () => {
    expect(skuOfCountKey('tally:', 'tally:c:{3}:')).to.equal('');
  });
});

describe('escapeGlob and scan patterns', () => {
  it('escapes every Redis glob metacharacter', () => {
    expect(escapeGlob('a*b?c[d]e\\f')).to.equal('a\\*b\\?c\\[d\\]e\\\\f');
    expect(escapeGlob('tally:')).to.equal('tally:');
    expect(escapeGlob('')).to.equal('');
    expect(escapeGlob('**')).to.equal('\\*\\*');
  });

  it('makes a text match only itself', () => {
    for (const text of ['a*b', 'x?', '[abc]', 'back\\slash', 'p[^x]*', 'plain']) {
      const re = globToRegExp(escapeGlob(text));
      expect(re.test(text), text).to.equal(true);
      expect(re.test(`${text}x`), text).to.equal(false);
      expect(re.test(text.replace(/[*?[\]\\]/g, 'z')), text).to.equal(text.replace(/[*?[\]\\]/g, 'z') === text);
    }
  });

  it('count and marker scan patterns match their own keys and nothing else', () => {
    const prefix = 'tally:';
    expect(countScanPattern(prefix)).to.equal('tally:c:{*}:*');
    expect(markerScanPattern(prefix)).to.equal('tally:mk:{*}:*');
    expect(legacyMarkerScanPattern(prefix)).to.equal('tally:m:{*}:*');
    const counts = globToRegExp(countScanPattern(prefix));
    const markers = globToRegExp(markerScanPattern(prefix));
    const legacy = globToRegExp(legacyMarkerScanPattern(prefix));
    expect(markers.test(markerBucketKey(prefix, 5, 123, 45))).to.equal(true);
    expect(legacy.test(markerBucketKey(prefix, 5, 123, 45))).to.equal(false);
    expect(counts.test(markerBucketKey(prefix, 5, 123, 45))).to.equal(false);
    for (const sku of TRICKY_SKUS) {
      expect(counts.test(countKey(prefix, 5, sku)), sku).to.equal(true);
      expect(markers.test(countKey(prefix, 5, sku)), sku).to.equal(false);
      expect(legacy.test(countKey(prefix, 5, sku)), sku).to.equal(false);
      expect(legacy.test(legacyMarkerKey(prefix, 5, sku)), sku).to.equal(true);
      expect(markers.test(legacyMarkerKey(prefix, 5, sku)), sku).to.equal(false);
      expect(counts.test(legacyMarkerKey(prefix, 5, sku)), sku).to.equal(false);
      expect(counts.test(countKey('other:', 5, sku)), sku).to.equal(false);
    }
    expect(counts.test(statsKey(prefix))).to.equal(false);
    expect(counts.test(receiptKey(prefix, 5, 'b'))).to.equal(false);
  });
});
