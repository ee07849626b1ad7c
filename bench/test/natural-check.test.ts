/** The natural check's figures (natural-check.ts) and flags: pure, no server. */
import { expect } from 'chai';
import { parseInfo } from '@tally/shared';
import { renderNaturalCheck, windowFigures, type RunCounters } from '../src/natural-check.js';
import { commandTimes } from '../src/redis-info.js';
import { BenchUsageError, parseBenchArgs } from '../src/options.js';

function counters(over: Partial<RunCounters>): RunCounters {
  return {
    atMs: 0,
    messages: 0,
    batches: 0,
    batchParts: 0,
    daemonCpuS: 0,
    redisCpuS: 0,
    commands: new Map(),
    expiredKeys: 0,
    expireCycleMs: 0,
    ...over,
  };
}

describe('natural check', () => {
  it('reads calls and usec per command from INFO commandstats', () => {
    const times = commandTimes(parseInfo('# Commandstats\r\ncmdstat_evalsha:calls=4,usec=900,usec_per_call=225.00\r\ncmdstat_hset:calls=12,usec=30\r\n'));
    expect([...times]).to.deep.equal([
      ['evalsha', { calls: 4, usec: 900 }],
      ['hset', { calls: 12, usec: 30 }],
    ]);
  });

  it('turns two readings into per-message figures, and keeps script time apart from what scripts call', () => {
    const start = counters({
      atMs: 1_000,
      messages: 1_000,
      batches: 10,
      batchParts: 400,
      daemonCpuS: 5,
      redisCpuS: 2,
      commands: new Map([['evalsha', { calls: 10, usec: 1_000 }]]),
      expiredKeys: 7,
      expireCycleMs: 1,
    });
    const end = counters({
      atMs: 11_000,
      messages: 3_000,
      batches: 60,
      batchParts: 2_400,
      daemonCpuS: 5.2,
      redisCpuS: 2.05,
      commands: new Map([
        ['evalsha', { calls: 60, usec: 41_000 }],
        ['hset', { calls: 50, usec: 5_000 }],
      ]),
      expiredKeys: 207,
      expireCycleMs: 3,
    });
    const w = windowFigures(start, end);
    expect(w.seconds).to.equal(10);
    expect(w.messages).to.equal(2_000);
    expect(w.msgPerSec).to.equal(200);
    expect(w.partsPerBatch).to.equal(40);
    expect(w.daemonCpuUsPerMsg).to.be.closeTo(100, 1e-6);
    expect(w.redisCpuUsPerMsg).to.be.closeTo(25, 1e-6);
    // 50,000 µs of CPU, 40,000 of them in EVALSHA (the HSET inside it counted there too).
    expect(w.outsideScriptsUsPerMsg).to.be.closeTo(5, 1e-6);
    expect(w.commandUsPerMsg).to.deep.equal([
      ['evalsha', 20],
      ['hset', 2.5],
    ]);
    expect(w.commandsPerMsg).to.equal(0.05);
    expect(w.expiredKeysPerMsg).to.equal(0.1);
    expect(w.expireCycleUsPerMsg).to.equal(1);
    const table = renderNaturalCheck({
      rate: 200,
      markerTtlS: 600,
      windowS: 10,
      natural: { markers: 5, receipts: 7 },
      filled: { markers: 6, receipts: 8 },
      naturalWindow: w,
      filledWindow: w,
      problems: [],
    });
    expect(table).to.include('| Redis CPU µs / msg | 25.0 | 25.0 | 1.00 |');
    expect(table).to.include('in HSET (from scripts too)');
    expect(table).to.include("the natural run's prefix held 5 markers and 7 write receipts; the filled one's, 6 markers and 8 write receipts");
  });

  it('refuses a window that saw no message rather than dividing by zero', () => {
    expect(() => windowFigures(counters({ messages: 5 }), counters({ messages: 5, atMs: 1 }))).to.throw(RangeError, 'no message');
  });

  it('parses --natural-check and its flags, which go with it only', () => {
    const options = parseBenchArgs(['--natural-check', '--natural-rate', '2000', '--natural-ttl', '120']);
    expect(options).to.include({ command: 'natural-check', naturalRate: 2_000, naturalTtlS: 120, naturalWindowS: 100 });
    expect(() => parseBenchArgs(['--natural-ttl', '120'])).to.throw(BenchUsageError, '--natural-ttl goes with --natural-check');
    expect(() => parseBenchArgs(['--natural-check', '--natural-window', '1'])).to.throw(BenchUsageError, '--natural-window');
  });
});
