import { expect } from 'chai';
import { deliveryParser, parseMessage, parseMessageMapping, splitByShard, type MessageMapping } from '@tally/shared';
import { badSample, foreignBadSample } from '../src/bad-corpus.js';
import { FOREIGN_SHAPE_MAPPING } from '../src/foreign-shape.js';
import { generateWorkload } from '../src/workload.js';
import { zipfPicker, seededRandom } from '../src/random.js';

/** Recomputes the truth from the published bodies the way the daemon would count them. */
function countLikeTally(
  publishes: ReturnType<typeof generateWorkload>['publishes'],
  acceptTypes: ReadonlySet<string> | null,
  mapping: MessageMapping | null = null,
): Map<string, number> {
  const seen = new Set<string>();
  const counts = new Map<string, number>();
  const parse = deliveryParser(mapping, { maxBytes: 65_536 });
  for (const p of publishes) {
    const parsed = parse(p.body, { messageId: p.messageId, headers: p.headers });
    if (!parsed.ok || seen.has(parsed.message.id)) continue;
    seen.add(parsed.message.id);
    for (const part of splitByShard(parsed.message.changes, 16, acceptTypes).values()) {
      for (const [sku, delta] of part) counts.set(sku, (counts.get(sku) ?? 0) + delta);
    }
  }
  for (const [sku, n] of counts) if (n === 0) counts.delete(sku);
  return counts;
}

describe('workload generator', () => {
  it('is reproducible from its seed', () => {
    const a = generateWorkload({ messages: 500, seed: 9 });
    const b = generateWorkload({ messages: 500, seed: 9 });
    const c = generateWorkload({ messages: 500, seed: 10 });
    expect(a.publishes.map((p) => p.body.toString())).to.deep.equal(b.publishes.map((p) => p.body.toString()));
    expect(a.publishes.map((p) => p.body.toString())).to.not.deep.equal(c.publishes.map((p) => p.body.toString()));
  });

  it('states a truth equal to what a correct deduplicating counter computes from the bodies', () => {
    const w = generateWorkload({ messages: 3_000, skus: 200, seed: 4, duplicateRate: 0.05, badRate: 0.03, minDelta: -2, maxDelta: 4 });
    expect(countLikeTally(w.publishes, null)).to.deep.equal(w.truth);
    const accept = new Set(['sale']);
    const typed = generateWorkload({ messages: 1_000, seed: 5, types: ['sale', 'audit'], acceptTypes: accept });
    expect(countLikeTally(typed.publishes, accept)).to.deep.equal(typed.truth);
  });

  it('publishes the stated numbers of good, duplicate and bad messages, duplicates both near and far', () => {
    const w = generateWorkload({ messages: 5_000, seed: 6, duplicateRate: 0.02, badRate: 0.01 });
    const kinds = { good: 0, duplicate: 0, bad: 0 };
    for (const p of w.publishes) kinds[p.kind]++;
    expect(kinds).to.deep.equal({ good: 5_000, duplicate: 100, bad: 50 });
    const firstAt = new Map<string, number>();
    const gaps: number[] = [];
    w.publishes.forEach((p, i) => {
      if (p.kind === 'good') firstAt.set(p.id!, i);
      if (p.kind === 'duplicate') gaps.push(i - firstAt.get(p.id!)!);
    });
    expect(
      gaps.every((g) => g > 0),
      'a duplicate follows its original',
    ).to.equal(true);
    expect(gaps.filter((g) => g <= 25).length, 'near duplicates').to.be.greaterThan(20);
    expect(gaps.filter((g) => g > 500).length, 'far duplicates').to.be.greaterThan(20);
  });

  it('gives every bad sample the reason parseMessage gives it', () => {
    for (let kind = 0; kind < 28; kind++) {
      const sample = badSample(kind, kind, 4_096);
      const parsed = parseMessage(sample.body, sample.messageId, { maxBytes: 4_096 });
      expect(parsed.ok, `sample ${kind}`).to.equal(false);
      if (!parsed.ok) expect(parsed.reason, `sample ${kind}`).to.equal(sample.reason);
    }
  });

  describe('the foreign shape', () => {
    const mapping = parseMessageMapping('TALLY_MESSAGE_MAPPING', JSON.stringify(FOREIGN_SHAPE_MAPPING));

    it('states a truth keyed by warehouse:sku equal to what the mapped parse counts, ids in the body and in the header', () => {
      const w = generateWorkload({
        shape: 'foreign',
        messages: 3_000,
        skus: 200,
        seed: 4,
        duplicateRate: 0.05,
        badRate: 0.03,
        minDelta: -2,
        maxDelta: 4,
        types: ['sale', 'audit'],
      });
      expect(countLikeTally(w.publishes, null, mapping)).to.deep.equal(w.truth);
      expect([...w.truth.keys()].every((sku) => /^WH[1-4]:SKU-\d{6}$/.test(sku))).to.equal(true);
      const headerIds = w.publishes.filter((p) => p.kind === 'good' && p.headers?.['x-event-id'] === p.id).length;
      expect(headerIds, 'about a tenth carry their id in the header').to.be.within(200, 400);
      expect(countLikeTally(w.publishes, null), 'the contract parse counts none of it').to.deep.equal(new Map());
      const accept = new Set(['sale']);
      const typed = generateWorkload({ shape: 'foreign', messages: 1_000, seed: 5, types: ['sale', 'audit'], acceptTypes: accept });
      expect(countLikeTally(typed.publishes, accept, mapping)).to.deep.equal(typed.truth);
    });

    it('gives every bad sample the reason the mapped parse gives it, naming its mapped path', () => {
      const parse = deliveryParser(mapping, { maxBytes: 4_096 });
      for (let kind = 0; kind < 30; kind++) {
        const sample = foreignBadSample(kind, kind, 4_096);
        const parsed = parse(sample.body, { headers: sample.messageId === undefined ? {} : { 'x-event-id': sample.messageId } });
        expect(parsed.ok, `sample ${kind}`).to.equal(false);
        if (parsed.ok) continue;
        expect(parsed.reason, `sample ${kind}: ${parsed.detail}`).to.equal(sample.reason);
        if (sample.path !== undefined) expect(parsed.detail, `sample ${kind}`).to.include(sample.path);
      }
    });
  });

  it('skews SKU popularity with zipf and stays uniform at 0', () => {
    const random = seededRandom(1);
    const pick = zipfPicker(100, 1.2, random);
    const hits = new Array<number>(100).fill(0);
    for (let i = 0; i < 20_000; i++) hits[pick()]!++;
    expect(hits[0]!).to.be.greaterThan(hits[50]! * 10);
    const uniform = zipfPicker(100, 0, random);
    const flat = new Array<number>(100).fill(0);
    for (let i = 0; i < 20_000; i++) flat[uniform()]!++;
    expect(Math.max(...flat) / Math.min(...flat)).to.be.below(2);
  });
});
