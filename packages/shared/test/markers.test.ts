import { expect } from 'chai';
import {
  bucketExpiresAt,
  bucketOf,
  bucketsToCheck,
  filterSlotOf,
  claimValue,
  defaultBucketWidthS,
  isPowerOfTwo,
  markerBaseKey,
  markerBucketKey,
  markerDigest,
  oldestLiveBucket,
  parseClaim,
  parseMarkerBucketKey,
  parsePartFlags,
  subBucketOf,
  subBucketsAfter,
  markerMetaKey,
} from '../src/markers.js';

describe('marker digests', () => {
  it('are the first 16 bytes of SHA-256 of the id', () => {
    // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a396177a9cb410ff61f20015ad
    expect(markerDigest('abc').toString('hex')).to.equal('ba7816bf8f01cfea414140de5dae2223');
    expect(markerDigest('')).to.have.length(16);
    expect(markerDigest('x'.repeat(10_000))).to.have.length(16);
    // The id's UTF-8 bytes, as every client and the scripts see them: printf '%s' '商品-😀' | sha256sum
    expect(markerDigest('商品-😀').toString('hex')).to.equal('74e358d9592993fefb23206937ce32a4');
    expect(markerDigest('msg-1').equals(markerDigest('msg-2'))).to.equal(false);
  });

  it('spread over the sub-buckets evenly', () => {
    const subBuckets = 64;
    const hits = new Array<number>(subBuckets).fill(0);
    for (let i = 0; i < 64_000; i++) hits[subBucketOf(markerDigest(`id-${i}`), subBuckets)]!++;
    for (const n of hits) expect(n).to.be.within(800, 1_200);
  });

  it('pick their sub-bucket from the first two bytes, as the scripts do', () => {
    const digest = Buffer.from([0x12, 0x34, 0xff]);
    expect(subBucketOf(digest, 1)).to.equal(0);
    expect(subBucketOf(digest, 256)).to.equal(0x34);
    expect(subBucketOf(digest, 65_536)).to.equal(0x1234);
    expect(subBucketOf(digest, 4096)).to.equal(0x234);
  });
});

describe('filter slots (marker_buckets.lua coordinatesOf, and test/filter-arithmetic.test.ts in the worker against the script itself)', () => {
  /** A digest with these bytes 5..8 (the block word) and 9..12 (the four bits); the rest pick the sub-bucket and shard. */
  const digest = (word: readonly number[], bits: readonly number[]) => Buffer.from([0xaa, 0xbb, 0xcc, 0xdd, ...word, ...bits, 0xee, 0xee, 0xee, 0xee]);

  it('picks the block from bytes 5..8, big-endian and unsigned, modulo the block count', () => {
    expect(filterSlotOf(digest([0, 0, 1, 2], [0, 0, 0, 0]), 64).block).to.equal(258 % 64);
    expect(filterSlotOf(digest([0, 0, 1, 2], [0, 0, 0, 0]), 1000).block).to.equal(258);
    expect(filterSlotOf(digest([0xff, 0xff, 0xff, 0xff], [0, 0, 0, 0]), 1000).block).to.equal(4_294_967_295 % 1000);
    expect(filterSlotOf(digest([0x80, 0, 0, 0], [0, 0, 0, 0]), 12_288).block).to.equal(2 ** 31 % 12_288);
  });

  it('sets one bit for each of bytes 9..12, modulo 32: four bits, fewer only when two bytes agree', () => {
    // 0, 33, 66, 63 -> bits 0, 1, 2, 31 (the top bit: the word is unsigned).
    expect(filterSlotOf(digest([0, 0, 0, 5], [0, 33, 66, 63]), 64)).to.deep.equal({ block: 5, bits: 0x80000007 });
    expect(filterSlotOf(digest([0, 0, 0, 5], [7, 8, 9, 10]), 64).bits).to.equal(0b1111 << 7);
    // 3 and 35 name the same bit.
    expect(filterSlotOf(digest([0, 0, 0, 5], [3, 35, 4, 5]), 64).bits).to.equal(0b111 << 3);
  });

  it('sets four distinct bits for every digest whose four bytes differ modulo 32', () => {
    for (let i = 0; i < 2_000; i++) {
      const d = markerDigest(`slot-${i}`);
      const distinct = new Set([d[8]! % 32, d[9]! % 32, d[10]! % 32, d[11]! % 32]).size;
      let bits = filterSlotOf(d, 64).bits;
      let set = 0;
      for (; bits !== 0; bits >>>= 1) set += bits & 1;
      expect(set, d.toString('hex')).to.equal(distinct);
    }
  });
});

describe('bucket arithmetic', () => {
  it('keeps a marker findable for at least the TTL and for at most one bucket width more', () => {
    let seed = 7;
    const random = () => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
    for (let trial = 0; trial < 5_000; trial++) {
      const ttl = 1 + Math.floor(random() * 5_000);
      const width = 1 + Math.floor(random() * 2 * ttl);
      const t = 1_700_000_000 + Math.floor(random() * 1e6);
      const bucket = bucketOf(t, width);
      const expires = bucketExpiresAt(bucket, width, ttl);
      expect(expires - t, `ttl ${ttl} width ${width}`).to.be.within(ttl, ttl + width);
      // Every check up to the TTL later reads the marker's bucket, and no more buckets than bucketsToCheck.
      for (const later of [t, t + 1, t + Math.floor(ttl / 2), t + ttl - 1, t + ttl]) {
        const oldest = oldestLiveBucket(later, width, ttl);
        expect(oldest, `check at +${later - t}`).to.be.at.most(bucket);
        expect(bucketOf(later, width) - oldest + 1).to.be.at.most(bucketsToCheck(width, ttl));
      }
      // Once the bucket has expired, checks no longer read it.
      expect(oldestLiveBucket(expires, width, ttl)).to.be.greaterThan(bucket);
    }
  });

  it('reads at most 3 buckets at the default width (half the TTL)', () => {
    for (const ttl of [1, 2, 3, 60, 599, 600, 601, 86_400]) expect(bucketsToCheck(defaultBucketWidthS(ttl), ttl), String(ttl)).to.be.at.most(3);
    expect(defaultBucketWidthS(600)).to.equal(300);
    expect(defaultBucketWidthS(1)).to.equal(1);
  });

  it('sizes a new bucket from the one before: about 64 markers per hash, within 1..65536', () => {
    expect(subBucketsAfter(null, 256), 'unknown: the initial count').to.equal(256);
    expect(subBucketsAfter(0, 256)).to.equal(1);
    expect(subBucketsAfter(64, 256)).to.equal(1);
    expect(subBucketsAfter(65, 256)).to.equal(2);
    expect(subBucketsAfter(12_200, 256)).to.equal(256);
    expect(subBucketsAfter(1_462_500, 256), '20k msg/s, 300 s buckets, 3.9 shards of 16').to.equal(32_768);
    expect(subBucketsAfter(1e12, 256)).to.equal(65_536);
    for (let n = 1; n < 100_000; n = Math.ceil(n * 1.7)) {
      const subs = subBucketsAfter(n, 1);
      expect(n / subs, `${n} markers`).to.be.within(0, 64);
      expect(isPowerOfTwo(subs)).to.equal(true);
      if (subs > 1) expect(n / (subs / 2)).to.be.greaterThan(64);
    }
  });

  it('recognises powers of two', () => {
    expect([1, 2, 256, 65_536].every(isPowerOfTwo)).to.equal(true);
    expect([0, 3, 100, -2, 1.5].some(isPowerOfTwo)).to.equal(false);
  });
});

describe('marker keys and values', () => {
  it('round-trip a bucket key and keep the shard hash tag', () => {
    const key = markerBucketKey('tally:', 12, 5_678_901, 255);
    expect(key).to.equal('tally:mk:{12}:5678901:255');
    expect(key.startsWith(markerBaseKey('tally:', 12))).to.equal(true);
    expect(parseMarkerBucketKey('tally:', key)).to.deep.equal({ vshard: 12, bucket: 5_678_901, sub: 255 });
    expect(markerMetaKey('tally:', 12, 5_678_901)).to.equal('tally:mk:{12}:5678901:m');
    expect(parseMarkerBucketKey('tally:', markerMetaKey('tally:', 12, 5_678_901)), 'a meta hash is not a marker hash').to.equal(null);
    for (const bad of ['tally:mk:{x}:1:2', 'tally:mk:{1}:1', 'tally:m:{1}:id', 'other:mk:{1}:1:2', 'tally:mk:{1}:1:2:3']) {
      expect(parseMarkerBucketKey('tally:', bad), bad).to.equal(null);
    }
  });

  it('tell a claim from a done marker', () => {
    expect(parseClaim(claimValue('0a1b', 1_700_000_000_123))).to.deep.equal({ token: '0a1b', atMs: 1_700_000_000_123 });
    expect(parseClaim('1')).to.equal(null);
    expect(claimValue('0123456789abcdef', 1_700_000_000_123).length, 'fits a listpack value').to.be.at.most(64);
  });

  it('parses the scripts’ flags and refuses a malformed answer', () => {
    expect([...parsePartFlags('0120', 4)]).to.deep.equal([0, 1, 2, 0]);
    expect(() => parsePartFlags('01', 3)).to.throw(/2 flags for 3 parts/);
    expect(() => parsePartFlags('0x', 2)).to.throw(/flag x/);
  });
});
