import { expect } from 'chai';
import { WindowGauge, type CounterName } from '@tally/shared';
import { ExposureMeter } from '../../src/exposure-meter.js';

function sink(): { totals: Map<CounterName, number>; add(name: CounterName, amount: number): void } {
  const totals = new Map<CounterName, number>();
  return { totals, add: (name, amount) => totals.set(name, (totals.get(name) ?? 0) + amount) };
}

describe('ExposureMeter', () => {
  it('integrates occupied-but-unacked messages over loaded time, and drops them once acked', () => {
    const out = sink();
    let loaded = true;
    const meter = new ExposureMeter(out, () => loaded, () => 0);
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
    meter.acked(2);
    meter.sample(2000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(2000);
    meter.acked(3);
    loaded = false;
    meter.sample(3000);
    expect(out.totals.get('loaded_ms'), 'time under light load is left out').to.equal(2000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(2000);
  });

  it('integrates the messages the window gauge shows, while loaded, including a window never closed', () => {
    const out = sink();
    let loaded = true;
    const gauge = WindowGauge.create(4);
    const meter = new ExposureMeter(out, () => loaded, () => gauge.messages());
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
    const meter = new ExposureMeter(out, () => true, null);
    const old = {};
    const live = {};
    meter.channelChanged(old);
    meter.channelChanged(live);
    meter.sample(0);
    meter.batchDone([{ link: old, tag: 1, parts: 1 }]);
    meter.occupied(live, 1, 1);
    meter.sample(100);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(100);
    expect(out.totals.get('window_message_ms')).to.equal(undefined);
  });
});
