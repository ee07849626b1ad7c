import { expect } from 'chai';
import { cell, markdownTable, renderCommandTimeTable, renderSteadyReport, renderSummaryTable } from '../src/render-table.js';
import { escapeXml, renderLineChart, textWidth, tickText, ticks } from '../src/render-svg.js';
import type { BenchResults, ContenderSummary } from '../src/results.js';

const row = (over: Partial<ContenderSummary>): ContenderSummary => ({
  contender: 'tally-two-step',
  variant: 'fresh',
  label: 'Tally two-step',
  rounds: 3,
  msgPerSec: 15_234.4,
  ratioToCeiling: 0.7612,
  ratioToNaive: 5.12,
  ratioToBatched: 1.43,
  redisCpuToBatched: 0.8,
  p50Ms: 61.25,
  p99Ms: 120.5,
  cpuSecondsPerMillion: 98.4,
  mainThreadCpuUsPerMessage: 40.1,
  warmupSeconds: 0.8,
  warmupMsgPerSec: 6_000,
  steadyMarkers: Number.NaN,
  fillSeconds: Number.NaN,
  peakRssMb: 180.2,
  redisCommandsPerMessage: 3.456,
  redisBytesPerMessage: 141.6,
  redisCpuUsPerMessage: 5.25,
  markerBytesPerMarker: 110,
  markerBytesPerMessage: 480.4,
  correct: true,
  ...over,
});

describe('markdown table', () => {
  it('formats cells: thousands, decimals, n/a for missing', () => {
    expect(cell(15234.4)).to.equal('15,234');
    expect(cell(0.7612, 2)).to.equal('0.76');
    expect(cell(1234567.891, 1)).to.equal('1,234,567.9');
    expect(cell(Number.NaN)).to.equal('n/a');
  });

  it('renders a header, an alignment row and escaped cells', () => {
    const table = markdownTable(['a', 'b'], [['x|y', '1']]);
    expect(table.split('\n')).to.deep.equal(['| a | b |', '|---|---:|', '| x\\|y | 1 |']);
  });

  it('renders one row per contender, a failed one marked NO', () => {
    const table = renderSummaryTable([
      row({}),
      row({ contender: 'tally-atomic', label: 'Tally atomic', rounds: 0, msgPerSec: Number.NaN, correct: false }),
      row({ contender: 'naive', label: 'naive (per message)', correct: false, ratioToNaive: 1 }),
    ]);
    const lines = table.split('\n');
    expect(lines).to.have.length(5);
    expect(lines[2]).to.equal('| Tally two-step | 15,234 | 0.76 | 5.12 | 1.43 | 61.3 | 120.5 | 98.4 | 40.1 | 5.3 | 180 | 3.46 | 142 | 480 | yes |');
    expect(lines[3]).to.match(/^\| Tally atomic \| n\/a \|.*\| NO \|$/);
    expect(lines[4]).to.match(/\| NO \|$/);
    for (const line of lines) expect(line.split(/(?<!\\)\|/).length).to.equal(lines[0]!.split('|').length);
  });
});

describe('steady-state report', () => {
  const results = (options: unknown): BenchResults => ({
    version: 1,
    startedAt: 'a',
    finishedAt: 'b',
    quick: true,
    steadyState: true,
    machine: { cpus: 2, node: 'v20', redis: '7.0.15' },
    options,
    rounds: 1,
    summary: [],
    drains: [],
    latencies: [],
    markerMemory: [],
    sweeps: [],
    problems: [],
  });

  it('says when every contender was filled at one --steady-phase, and says nothing of it on the clock', () => {
    expect(renderSteadyReport(results({ steadyRate: 2000, steadyPhase: 0.5 }))).to.include('bucket of now is filled 50 % full (--steady-phase)');
    expect(renderSteadyReport(results({ steadyRate: 2000, steadyPhase: null }))).not.to.include('--steady-phase');
  });

  it('says per drain which commands took Redis its microseconds per message, the largest first', () => {
    const drain = (contender: string, variant: string | undefined, commandUsec: Record<string, number> | undefined) =>
      ({
        contender,
        round: 0,
        messages: 1_000,
        redisCpuSeconds: 0.00635,
        ...(variant ? { variant } : {}),
        redisDetail: { keys: 0, hashtableBytes: 0, slotToKeysBytes: 0, commandCalls: {}, errors: {}, ...(commandUsec ? { commandUsec } : {}) },
      }) as unknown as BenchResults['drains'][number];
    const table = renderCommandTimeTable(
      {
        drains: [
          { ...drain('tally-native-claims', 'steady', { incrby: 1_060, evalsha: 2_900, hsetnx: 1_580, info: 90, hget: 80, time: 1 }), partsPerBatch: 412.4 },
          drain('ceiling', undefined, undefined),
        ],
      },
      2,
    );
    expect(table).to.include('| 1 | tally-native-claims, steady | 6.35 | 412 | evalsha 2.90, hsetnx 1.58, others 1.14 |');
    expect(table, 'a drain without the figures is left out').not.to.include('ceiling');
    expect(table, "the bench's own INFO is not the contender's").not.to.include('info');
    // --scale-out's figures: the same drain on each topology, told apart by a column.
    const standalone = drain('tally-two-step', undefined, { evalsha: 900 });
    const cluster = drain('tally-two-step', undefined, { evalsha: 1_400 });
    const byTopology = renderCommandTimeTable({ drains: [standalone, cluster] }, 2, (d) => (d === cluster ? 'cluster' : 'standalone'));
    expect(byTopology).to.include('| round | topology | drain |');
    expect(byTopology).to.include('| 1 | standalone | tally-two-step | 6.35 | n/a | evalsha 0.90 |');
    expect(byTopology).to.include('| 1 | cluster | tally-two-step | 6.35 | n/a | evalsha 1.40 |');
  });
});

describe('svg chart', () => {
  it('escapes text and writes compact ticks', () => {
    expect(escapeXml('a<b & "c"')).to.equal('a&lt;b &amp; &quot;c&quot;');
    expect(tickText(20_000)).to.equal('20k');
    expect(tickText(1_500)).to.equal('1.5k');
    expect(tickText(0.25)).to.equal('0.25');
    expect(ticks(0, 100, 'linear')).to.deep.equal([0, 20, 40, 60, 80, 100]);
    expect(ticks(10, 1000, 'log')).to.deep.equal([10, 20, 50, 100, 200, 500, 1000]);
  });

  it('renders a well-formed standalone SVG with every data point and reference line', () => {
    const svg = renderLineChart({
      title: 'Throughput <vs> batch',
      xLabel: 'batch',
      yLabel: 'msg/s',
      xScale: 'log',
      series: [
        {
          name: 'Tally',
          points: [
            { x: 50, y: 8_000 },
            { x: 200, y: 12_000 },
            { x: 500, y: 15_000 },
            { x: 2_000, y: 14_000 },
          ],
        },
        {
          name: 'ceiling',
          points: [
            { x: 50, y: 20_000 },
            { x: 2_000, y: 21_000 },
          ],
        },
      ],
      references: [{ name: 'naive', y: 3_000 }],
    });
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).to.equal(true);
    expect(svg.trimEnd().endsWith('</svg>')).to.equal(true);
    expect(svg).to.contain('Throughput &lt;vs&gt; batch');
    expect(svg.match(/<circle class="point"/g)).to.have.length(6);
    expect(svg.match(/<polyline class="series"/g)).to.have.length(2);
    expect(svg.match(/class="reference"/g)).to.have.length(1);
    // Every opened element is closed (self-closing or with its end tag).
    const opened = (svg.match(/<(svg|title|text|circle)\b/g) ?? []).length;
    const closed = (svg.match(/<\/(svg|title|text|circle)>/g) ?? []).length;
    expect(opened).to.equal(closed);
    // Coordinates are plain numbers, no NaN leaking through.
    expect(svg).to.not.match(/NaN|Infinity|undefined/);
  });

  it('puts a higher y higher on the page, and survives missing data', () => {
    const svg = renderLineChart({
      title: 't',
      xLabel: 'x',
      yLabel: 'y',
      series: [
        {
          name: 's',
          points: [
            { x: 1, y: 10 },
            { x: 2, y: 20 },
          ],
        },
      ],
    });
    const ys = [...svg.matchAll(/<circle class="point" cx="[\d.]+" cy="([\d.]+)"/g)].map((m) => Number(m[1]));
    expect(ys[1]).to.be.lessThan(ys[0]!);
    const empty = renderLineChart({ title: 't', xLabel: 'x', yLabel: 'y', yScale: 'log', series: [{ name: 's', points: [{ x: 1, y: Number.NaN }] }] });
    expect(empty).to.not.match(/NaN|Infinity/);
    expect(empty).to.not.contain('<circle');
  });
});

describe('svg chart legend and caption', () => {
  it('grows the chart so that the longest legend entry and every caption line fit', () => {
    const long = 'a series whose name is much longer than the 330 pixels the legend once had, WITH CAPITALS';
    const svg = renderLineChart({
      title: 't',
      xLabel: 'x',
      yLabel: 'y',
      series: [
        {
          name: long,
          points: [
            { x: 1, y: 1 },
            { x: 2, y: 2 },
          ],
        },
        { name: 'marked', points: [{ x: 3, y: 1, label: '1 B at 3' }], line: false, shape: 'diamond' },
      ],
      caption: ['a caption line'],
    });
    const width = Number(/width="(\d+)"/.exec(svg)![1]);
    const entry = [...svg.matchAll(/<text x="([\d.]+)" y="[\d.]+">([^<]*)<\/text>/g)].find((m) => m[2] === long)!;
    expect(Number(entry[1]) + textWidth(long)).to.be.at.most(width);
    expect(svg).to.contain('class="caption"');
    expect(svg).to.contain('1 B at 3');
    expect(svg.match(/<polyline class="series"/g)).to.have.length(1);
    expect(svg.match(/<path class="point"/g)).to.have.length(2);
  });
});
