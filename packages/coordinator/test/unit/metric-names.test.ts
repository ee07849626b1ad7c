import { expect } from 'chai';
import { COUNTER_NAMES } from '@tally/shared';
import { counterInstrument, prometheusViews, SECONDS_INSTRUMENTS } from '../../src/telemetry/metrics.js';

/** What the Prometheus exporter makes of an instrument name (dots to underscores). */
const prometheusName = (name: string): string => name.replace(/[^a-zA-Z0-9_:]/g, '_');

describe('metric names (Prometheus conventions)', () => {
  it('exports every counter in base units: no abbreviated unit survives in a name', () => {
    for (const name of COUNTER_NAMES) {
      const instrument = counterInstrument(name);
      expect(prometheusName(instrument.name), name).to.not.match(/_(ms|msec|sec|secs|millis|milliseconds)(_|$)/);
      expect(instrument.name.startsWith('tally.'), name).to.equal(true);
    }
  });

  it('turns the millisecond exposure counters into seconds, scaled by 1/1000, and says seconds in the help', () => {
    expect(counterInstrument('loaded_ms')).to.include({ name: 'tally.loaded_seconds', scale: 0.001 });
    expect(counterInstrument('window_message_ms')).to.include({ name: 'tally.window_message_seconds', scale: 0.001 });
    expect(counterInstrument('occupied_unacked_message_ms')).to.include({ name: 'tally.occupied_unacked_message_seconds', scale: 0.001 });
    for (const name of ['loaded_ms', 'window_message_ms', 'occupied_unacked_message_ms'] as const) {
      expect(counterInstrument(name).description)
        .to.match(/seconds/)
        .and.not.match(/milli/);
    }
    expect(counterInstrument('duplicates')).to.include({ name: 'tally.duplicates', scale: 1 });
  });

  it('gives every seconds instrument a _seconds suffix through a view, and only those', () => {
    const views = prometheusViews();
    expect(views.map((v) => v.instrumentName)).to.deep.equal([...SECONDS_INSTRUMENTS]);
    for (const view of views) expect(prometheusName(view.name!)).to.equal(`${prometheusName(view.instrumentName!)}_seconds`);
    expect(views.map((v) => prometheusName(v.name!))).to.include.members([
      'tally_flush_duration_seconds',
      'tally_crash_window_duration_seconds',
      'messaging_process_duration_seconds',
      'tally_message_age_seconds',
      'tally_oldest_unacked_age_seconds',
    ]);
  });
});
