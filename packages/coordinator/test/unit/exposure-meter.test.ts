import { expect } from 'chai';
import { WindowGauge, type CounterName } from '@tally/shared';
import { ExposureMeter, type MeterSampling } from '../../src/telemetry/exposure-meter.js';

/** Sampled once a second: the tests below step time by whole seconds. */
const SECONDS: MeterSampling = { periodMs: 1000, maxGapMs: 10_000 };

function sink(): { totals: Map<CounterName, number>; add(name: CounterName, amount: number): void } {
  const totals = new Map<CounterName, number>();
  return { totals, add: (name, amount) => totals.set(name, (totals.get(name) ?? 0) + amount) };
}

describe('ExposureMeter', () => {
  it('integrates occupied-but-unacked messages over loaded time, and drops them once acked', () => {
    const out = sink();
    let loaded = true;
    const meter = new ExposureMeter({ sink: out, loaded: () => loaded, windowNow: () => 0 }, SECONDS);
    const link = {};
    meter.channelChanged(link);
    meter.sample(0);
    // Tag 2 done (one part of one), tag 3 half done (one part of two); tag 1 still in progress.
    meter.batchDone([
      { link, tag: 2, parts: 1 },
      { link, tag: 3, parts: 2 },
    ]);
    meter.sample(1000);
    expect(out.totals.get('loaded_ms')).to.equal(1000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(1500);
    meter.acked(link, 2);
    meter.sample(2000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(2000);
    meter.acked(link, 3);
    loaded = false;
    meter.sample(3000);
    expect(out.totals.get('loaded_ms'), 'time under light load is left out').to.equal(2000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(2000);
  });

  it('integrates the messages the window gauge shows, while loaded, including a window never closed', () => {
    const out = sink();
    let loaded = true;
    const gauge = WindowGauge.create(4);
    const meter = new ExposureMeter({ sink: out, loaded: () => loaded, windowNow: () => gauge.messages() }, SECONDS);
    meter.sample(0);
    // Shard 1 sends its count write for 100 new parts, shard 3 for 40 parts of half a message each.
    gauge.open(1, 100);
    gauge.open(3, 20);
    meter.sample(10);
    expect(out.totals.get('window_message_ms')).to.equal(1200);
    gauge.close(1);
    meter.sample(30);
    expect(out.totals.get('window_message_ms')).to.equal(1600);
    // Shard 3's window stays open (its daemon is about to be killed): what was sampled is already handed over.
    loaded = false;
    meter.sample(1000);
    expect(out.totals.get('window_message_ms'), 'time under light load is left out').to.equal(1600);
  });

  it('ignores tags of a dead channel and has no window in atomic mode', () => {
    const out = sink();
    const meter = new ExposureMeter({ sink: out, loaded: () => true, windowNow: null }, SECONDS);
    const old = {};
    const live = {};
    meter.channelChanged(old);
    meter.channelClosed(old);
    meter.channelChanged(live);
    meter.sample(0);
    meter.batchDone([{ link: old, tag: 1, parts: 1 }]);
    meter.occupied(live, 1, 1);
    meter.sample(100);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(100);
    expect(out.totals.get('window_message_ms')).to.equal(undefined);
  });

  it("keeps every unacked tag's share when the unacked range outgrows its slots (single acks behind a stalled head)", () => {
    const out = sink();
    const meter = new ExposureMeter({ sink: out, loaded: () => true, windowNow: null }, SECONDS);
    const live = {};
    meter.channelChanged(live);
    meter.sample(0);
    // Tag 1 stalls; 20,000 tags behind it are occupied, half of them singly acked.
    for (let tag = 2; tag <= 20_001; tag++) meter.occupied(live, tag, 0.5);
    for (let tag = 2; tag <= 20_001; tag += 2) meter.ackedOne(live, tag);
    meter.sample(1);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(5_000);
    meter.occupied(live, 1, 1);
    meter.acked(live, 20_001);
    meter.sample(2);
    expect(out.totals.get('occupied_unacked_message_ms'), 'nothing left once all are acked').to.equal(5_000);
    meter.occupied(live, 20_002, 1);
    meter.sample(3);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(5_001);
  });

  it('leaves out a sample interval far longer than the period: the process was frozen (SIGSTOP, a paused VM)', () => {
    const out = sink();
    const gauge = WindowGauge.create(2);
    const meter = new ExposureMeter({ sink: out, loaded: () => true, windowNow: () => gauge.messages() }, { periodMs: 50, maxGapMs: 500 });
    meter.sample(0);
    gauge.open(0, 100);
    meter.sample(50);
    // Late by a few periods (a busy event loop): still counted.
    meter.sample(450);
    expect(out.totals.get('loaded_ms')).to.equal(450);
    expect(out.totals.get('window_message_ms')).to.equal(45_000);
    // Frozen for 3 s with the window open: neither loaded time nor window time.
    meter.sample(3450);
    expect(out.totals.get('loaded_ms')).to.equal(450);
    expect(out.totals.get('window_message_ms')).to.equal(45_000);
    // Sampling goes on from the end of the gap.
    meter.sample(3500);
    expect(out.totals.get('loaded_ms')).to.equal(500);
    expect(out.totals.get('window_message_ms')).to.equal(50_000);
  });

  it('counts a batch as occupied-but-unacked from the moment its marker SETs are sent, not from when its result arrives', () => {
    const out = sink();
    const gauge = WindowGauge.create(2);
    const meter = new ExposureMeter({ sink: out, loaded: () => true, windowNow: () => gauge.messages(), settling: gauge }, SECONDS);
    const link = {};
    meter.channelChanged(link);
    meter.sample(0);
    gauge.open(1, 100);
    meter.sample(1000);
    // The SETs leave: out of the window, not yet in the meter's occupied map (the result is on its way).
    gauge.close(1);
    meter.sample(2000);
    expect(out.totals.get('window_message_ms')).to.equal(100_000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(100_000);
    // The result arrives: the same messages move to the occupied map, counted once.
    meter.batchReturned(1);
    meter.batchDone(Array.from({ length: 100 }, (_, i) => ({ link, tag: i + 1, parts: 1 })));
    meter.sample(3000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(200_000);
    meter.acked(link, 100);
    meter.sample(4000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(200_000);
    expect(out.totals.get('loaded_ms')).to.equal(4000);
  });
});
