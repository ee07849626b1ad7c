import { expect } from 'chai';
import { shardOf, STANDING_COUNTS_HEADER, standingCountsOfRecord } from '@tally/shared';
import {
  epochMs,
  exposureOf,
  firstDeadAt,
  forcedLine,
  markerLifeS,
  mayHaveBeenCountedSince,
  refusedLine,
  refusedShardOf,
  replayVerdict,
  riskOf,
  RiskSummary,
  standingLine,
  type DeadLetterFacts,
  type ReplayPolicy,
} from '../../src/commands/replay-guard.js';

const NOW = 1_750_000_000_000;
const SHARDS = 16;

/** Three SKUs in three different shards. */
const SKUS = (() => {
  const picked: string[] = [];
  const seen = new Set<number>();
  for (let i = 0; picked.length < 3; i++) {
    const sku = `SKU-${i}`;
    if (!seen.has(shardOf(sku, SHARDS))) {
      seen.add(shardOf(sku, SHARDS));
      picked.push(sku);
    }
  }
  return picked;
})();

function facts(headers: Record<string, unknown>, timestamp?: unknown): DeadLetterFacts {
  const body = { id: 'm-1', changes: SKUS.map((sku, i) => ({ sku, delta: (i + 1) * (i === 1 ? -1 : 1) })) };
  return { content: Buffer.from(JSON.stringify(body)), properties: { headers, timestamp } };
}

const refusedDetail = `ERR value is not an integer or out of range (sku ${JSON.stringify(SKUS[0])}, key t:c:{3}:${SKUS[0]}, delta 1)`;
const policy = (overrides: Partial<ReplayPolicy> = {}): ReplayPolicy => ({ markerLifeS: 600, force: false, nowMs: NOW, virtualShards: SHARDS, ...overrides });
/** x-death as amqplib decodes the broker's header: the time is an AMQP timestamp, in seconds. */
const xDeath = (atMs: number) => [{ count: 1, reason: 'delivery_limit', queue: 'q', time: { '!': 'timestamp', value: Math.floor(atMs / 1000) } }];

describe('replay guard (pure: may this dead letter have been counted, and may its markers have expired)', () => {
  it('tells what a replay could count twice from the reason', () => {
    for (const reason of ['malformed-json', 'missing-id', 'oversized-body', 'invalid-delta']) expect(exposureOf(reason), reason).to.equal('none');
    expect(exposureOf('count-refused')).to.equal('other-parts');
    for (const reason of ['delivery-limit', 'rejected', 'expired', 'maxlen', 'unknown']) expect(exposureOf(reason), reason).to.equal('whole');
  });

  it("relies on the shorter of the CLI's marker TTL and the one the prefix's bucket width implies", () => {
    expect(markerLifeS(600, null)).to.equal(600);
    expect(markerLifeS(600, 300)).to.equal(599);
    expect(markerLifeS(3600, 300), 'a CLI with a longer TTL than the daemon that laid the prefix out').to.equal(599);
    expect(markerLifeS(60, 300)).to.equal(60);
    expect(markerLifeS(5, 3)).to.equal(5);
    expect(markerLifeS(600, Number.NaN)).to.equal(600);
  });

  it('reads AMQP timestamps in seconds, milliseconds, and as amqplib decodes them', () => {
    expect(epochMs({ '!': 'timestamp', value: 1_700_000_000 })).to.equal(1_700_000_000_000);
    expect(epochMs(1_700_000_000_123)).to.equal(1_700_000_000_123);
    expect(epochMs(1_700_000_000)).to.equal(1_700_000_000_000);
    expect(epochMs('1700000000123')).to.equal(1_700_000_000_123);
    for (const bad of [undefined, null, 0, -5, 'soon', {}, Number.NaN, [1]]) expect(epochMs(bad), String(bad)).to.equal(null);
  });

  it("dates a count-refused message by Tally's dead-lettering time, a broker's by the earliest it may have been counted", () => {
    expect(mayHaveBeenCountedSince(facts({ 'x-tally-dead-at': NOW - 5_000 }, Math.floor((NOW - 60_000) / 1000)), 'other-parts')).to.equal(NOW - 5_000);
    // Parked by the delivery limit 5 s ago, published a minute ago: it may have been counted at its first delivery.
    expect(mayHaveBeenCountedSince(facts({ 'x-death': xDeath(NOW - 5_000) }, Math.floor((NOW - 60_000) / 1000)), 'whole')).to.equal(NOW - 60_000);
    expect(mayHaveBeenCountedSince(facts({ 'x-death': xDeath(NOW - 5_000) }), 'whole')).to.equal(Math.floor((NOW - 5_000) / 1000) * 1000);
    expect(mayHaveBeenCountedSince(facts({}), 'whole')).to.equal(null);
    expect(mayHaveBeenCountedSince(facts({ 'x-death': 'junk' }), 'whole')).to.equal(null);
  });

  it('dates a count-refused message dead-lettered again after a replay by its first dead-lettering: its other parts wrote no new marker', () => {
    const again = { 'x-tally-dead-at': NOW - 5_000, 'x-tally-first-dead-at': NOW - 590_000 };
    expect(firstDeadAt(again)).to.equal(NOW - 590_000);
    expect(mayHaveBeenCountedSince(facts(again), 'other-parts')).to.equal(NOW - 590_000);
    expect(mayHaveBeenCountedSince(facts(again), 'whole')).to.equal(NOW - 590_000);
    // The last dead-lettering alone would say 5 s: a replay 10 s from the end of the first one's markers.
    expect(replayVerdict(facts(again), 'count-refused', refusedDetail, policy({ nowMs: NOW + 15_000 })).action).to.equal('refuse');
    expect(replayVerdict(facts({ 'x-tally-dead-at': NOW - 5_000 }), 'count-refused', refusedDetail, policy({ nowMs: NOW + 15_000 })).action).to.equal('replay');
    // Whichever is earlier wins, and either alone is enough.
    expect(firstDeadAt({ 'x-tally-dead-at': NOW - 9_000, 'x-tally-first-dead-at': NOW - 1_000 })).to.equal(NOW - 9_000);
    expect(firstDeadAt({ 'x-tally-first-dead-at': String(NOW - 7_000) })).to.equal(NOW - 7_000);
    expect(firstDeadAt({ 'x-tally-dead-at': NOW - 3_000 })).to.equal(NOW - 3_000);
    expect(firstDeadAt({ 'x-tally-first-dead-at': 'junk' })).to.equal(null);
    expect(firstDeadAt(undefined)).to.equal(null);
  });

  it('replays what was never counted at any age, and what may have been while its markers live', () => {
    const ancient = facts({ 'x-tally-dead-at': NOW - 86_400_000 });
    expect(replayVerdict(ancient, 'malformed-json', 'x', policy()).action).to.equal('replay');
    expect(replayVerdict(facts({ 'x-tally-dead-at': NOW - 590_000 }), 'count-refused', refusedDetail, policy()).action).to.equal('replay');
    expect(replayVerdict(facts({ 'x-death': xDeath(NOW - 10_000) }), 'delivery-limit', '', policy()).action).to.equal('replay');
  });

  it('refuses, or with force replays as forced, what may have been counted once its markers may have expired, or when its age is unknown', () => {
    const cases: Array<[DeadLetterFacts, string, string]> = [
      [facts({ 'x-tally-dead-at': NOW - 600_000 }), 'count-refused', refusedDetail],
      // Within a clock margin of the end of the marker lifetime.
      [facts({ 'x-tally-dead-at': NOW - 599_500 }), 'count-refused', refusedDetail],
      [facts({ 'x-death': xDeath(NOW - 700_000) }), 'delivery-limit', ''],
      [facts({}), 'delivery-limit', ''],
      [facts({}), 'unknown', ''],
      [facts({ 'x-death': xDeath(NOW - 1_000) }, Math.floor((NOW - 3_600_000) / 1000)), 'expired', ''],
    ];
    for (const [f, reason, detail] of cases) {
      expect(replayVerdict(f, reason, detail, policy()).action, `${reason} ${JSON.stringify(f.properties)}`).to.equal('refuse');
      expect(replayVerdict(f, reason, detail, policy({ force: true })).action).to.equal('force');
    }
  });

  it("names the parts a count-refused message had counted: all but the refused SKU's shard", () => {
    expect(refusedShardOf(refusedDetail, SHARDS)).to.equal(shardOf(SKUS[0]!, SHARDS));
    expect(refusedShardOf('ERR something (shard 7)', SHARDS)).to.equal(7);
    expect(refusedShardOf('no place given', SHARDS)).to.equal(null);
    const others = [shardOf(SKUS[1]!, SHARDS), shardOf(SKUS[2]!, SHARDS)].sort((a, b) => a - b);
    expect(riskOf(facts({}), 'other-parts', refusedDetail, SHARDS)).to.deep.equal({ countedShards: others, changes: 2, units: 5 });
    expect(riskOf(facts({}), 'whole', '', SHARDS)).to.include({ changes: 3, units: 6 });
    expect(riskOf(facts({}), 'other-parts', 'unreadable', SHARDS), 'an upper bound when the refused shard is unknown').to.include({ units: 6 });
    expect(riskOf({ content: Buffer.from('{'), properties: {} }, 'whole', '', SHARDS)).to.equal(null);
  });

  it('sums the refused ones into one line naming --force, the messages and units at risk, and the counted parts of count-refused ones', () => {
    const summary = new RiskSummary();
    const old = facts({ 'x-tally-dead-at': NOW - 700_000 });
    for (let i = 0; i < 3; i++) {
      const verdict = replayVerdict(old, 'count-refused', refusedDetail, policy());
      if (verdict.action !== 'refuse') expect.fail('refused');
      summary.add(i, `m-${i}`, 'count-refused', verdict);
    }
    const parked = replayVerdict(facts({}), 'delivery-limit', '', policy());
    if (parked.action !== 'refuse') expect.fail('refused');
    summary.add(3, 'm-3', 'delivery-limit', parked);
    expect(summary.toJSON()).to.deep.include({ messages: 4, units: 3 * 5 + 6, byReason: { 'count-refused': 3, 'delivery-limit': 1 } });
    expect(summary.toJSON().countRefused).to.deep.equal({ messages: 3, countedParts: 6, countedUnits: 15 });
    const line = refusedLine(summary, 600);
    expect(line).to.not.include('\n');
    expect(line)
      .to.include('--force')
      .and.include('kept 4 dead letters')
      .and.include('up to 4 messages and 21 units')
      .and.include('3 count-refused had their other parts counted (6 parts, 15 units)');
    expect(forcedLine(summary, 600))
      .to.match(/^FORCED/)
      .and.include('forced_replays');
  });

  it('keeps back, at any age, a dead letter naming counts that stand on another shard, and names what to subtract before --force', () => {
    const standing = { 't:c:{5}:SKU-1': '-2', 't:c:{9}:SKU-2': '3' };
    // Seconds old: its markers live, but no marker covers counts an undo left standing.
    const young = facts({ 'x-tally-dead-at': NOW - 1_000, [STANDING_COUNTS_HEADER]: Buffer.from(JSON.stringify(standing)) });
    const verdict = replayVerdict(young, 'count-refused', refusedDetail, policy());
    expect(verdict).to.deep.include({ action: 'refuse', standing });
    expect(replayVerdict(young, 'count-refused', refusedDetail, policy({ force: true })).action).to.equal('force');
    // The same letter without the header replays; a bad message never counted replays whatever it carries.
    expect(replayVerdict(facts({ 'x-tally-dead-at': NOW - 1_000 }), 'count-refused', refusedDetail, policy()).action).to.equal('replay');
    expect(replayVerdict(young, 'malformed-json', 'x', policy()).action).to.equal('replay');
    // A broker's letter keeps its producer's headers: a forged one there is no one's word, its age decides.
    const forged = { [STANDING_COUNTS_HEADER]: JSON.stringify(standing) };
    expect(replayVerdict(facts({ ...forged, 'x-death': xDeath(NOW - 10_000) }), 'delivery-limit', '', policy()).action).to.equal('replay');
    // A header that cannot be read is taken to name some; a key that is not printable without spaces or quotes is not printed.
    const badKeys = [{ 'k 1': '5' }, { 'k"': '5' }, { 'k\u001b[2J': '5' }, { '': '5' }].map((o) => JSON.stringify(o));
    for (const hostile of ['{', '[]', '{}', JSON.stringify({ k: 5 }), JSON.stringify({ k: '1e3' }), 42, ...badKeys]) {
      const v = replayVerdict(facts({ 'x-tally-dead-at': NOW - 1_000, [STANDING_COUNTS_HEADER]: hostile }), 'count-refused', refusedDetail, policy());
      expect(v, String(hostile)).to.deep.include({ action: 'refuse', standing: 'unreadable' });
    }

    const summary = new RiskSummary();
    if (verdict.action !== 'refuse') expect.fail('refused');
    summary.add(0, 'm-0', 'count-refused', verdict);
    summary.add(1, 'm-1', 'count-refused', { ...verdict, standing: { 't:c:{5}:SKU-1': '-1' } });
    expect(summary.toJSON().standing).to.deep.equal({ messages: 2, unreadable: 0, counts: { 't:c:{5}:SKU-1': '-3', 't:c:{9}:SKU-2': '3' } });
    expect(refusedLine(summary, 600)).to.include('or counts of theirs stand');
    const line = standingLine(summary);
    expect(line).to.not.equal(null);
    expect(line!)
      .to.include('2 of them have counts that stand')
      .and.include('undo_failures')
      .and.include('INCRBY t:c:{5}:SKU-1 3, INCRBY t:c:{9}:SKU-2 -3')
      .and.include('--force');
    expect(forcedLine(summary, 600)).to.include('INCRBY t:c:{5}:SKU-1 3');
    expect(standingLine(new RiskSummary()), 'no line when nothing stands').to.equal(null);
  });

  it('keeps back a dead letter that lost its header when Redis records counts that stand for its message', () => {
    const recorded = { 't:c:{5}:SKU-1': '4' };
    const bare = facts({ 'x-tally-dead-at': NOW - 1_000 });
    expect(replayVerdict(bare, 'count-refused', refusedDetail, policy(), recorded)).to.deep.include({ action: 'refuse', standing: recorded });
    // Redis's record is the daemon's word: it wins over a header that cannot be read.
    const unreadable = facts({ 'x-tally-dead-at': NOW - 1_000, [STANDING_COUNTS_HEADER]: '{' });
    expect(replayVerdict(unreadable, 'count-refused', refusedDetail, policy(), recorded)).to.deep.include({ standing: recorded });
    // Read for count-refused letters only: a broker's letter of the same message is dated by its age.
    expect(replayVerdict(facts({ 'x-death': xDeath(NOW - 10_000) }), 'delivery-limit', '', policy(), recorded).action).to.equal('replay');
  });

  it('reads a standing record only when every field is a printable key and a decimal delta', () => {
    expect(standingCountsOfRecord({ 't:c:{5}:SKU-1': '-4' })).to.deep.equal({ 't:c:{5}:SKU-1': '-4' });
    expect(standingCountsOfRecord({}), 'no record').to.equal(null);
    expect(standingCountsOfRecord({ 'k 1': '4' })).to.equal(null);
    expect(standingCountsOfRecord({ k: '4.5' })).to.equal(null);
  });
});
