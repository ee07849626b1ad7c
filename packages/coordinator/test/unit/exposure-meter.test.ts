import { expect } from 'chai';
import type { CounterName } from '@tally/shared';
import { ExposureMeter } from '../../src/exposure-meter.js';

function sink(): { totals: Map<CounterName, number>; add(name: CounterName, amount: number): void } {
  const totals = new Map<CounterName, number>();
  return { totals, add: (name, amount) => totals.set(name, (totals.get(name) ?? 0) + amount) };
}

const TIMINGS = { precheckMs: 1, writeMs: 4, occupyMs: 2 };

describe('ExposureMeter', () => {
  it('integrates occupied-but-unacked messages over loaded time, and drops them once acked', () => {
    const out = sink();
    let loaded = true;
    const meter = new ExposureMeter(out, () => loaded, true);
    const link = {};
    meter.channelChanged(link);
    meter.sample(0);
    // Tag 2 done (one part of one), tag 3 half done (one part of two), tag 4
    // found already marked by the pre-check (a duplicate); tag 1 still in progress.
    meter.batchDone(
      [
        { link, tag: 2, parts: 1 },
        { link, tag: 3, parts: 2 },
        { link, tag: 4, parts: 1 },
      ],
      { marked: Uint8Array.of(0, 0, 1), timings: TIMINGS },
    );
    meter.sample(1000);
    expect(out.totals.get('loaded_ms')).to.equal(1000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(2500);
    // The window: the 1.5 messages written, for the 4 ms of the count write's
    // round trip; the duplicate was never written, so never in the window.
    expect(out.totals.get('window_message_ms')).to.equal(6);
    meter.acked(2);
    meter.sample(2000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(4000);
    meter.acked(4);
    loaded = false;
    meter.sample(3000);
    expect(out.totals.get('loaded_ms'), 'time under light load is left out').to.equal(2000);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(4000);
  });

  it('ignores tags of a dead channel and has no window in atomic mode', () => {
    const out = sink();
    const meter = new ExposureMeter(out, () => true, false);
    const old = {};
    const live = {};
    meter.channelChanged(old);
    meter.channelChanged(live);
    meter.sample(0);
    meter.batchDone([{ link: old, tag: 1, parts: 1 }], { marked: Uint8Array.of(0), timings: TIMINGS });
    meter.occupied(live, 1, 1);
    meter.sample(100);
    expect(out.totals.get('occupied_unacked_message_ms')).to.equal(100);
    expect(out.totals.get('window_message_ms')).to.equal(undefined);
  });
});
