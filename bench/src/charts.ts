/** Pure: the two charts of a run, from its records. */
import { CONTENDER_LABELS, type BenchResults, type ContenderName } from './results.js';
import { renderLineChart, type Series } from './render-svg.js';
import { median } from './stats.js';

export function throughputVsBatchChart(results: BenchResults): string {
  const points = results.sweeps.filter((s) => s.sweep === 'batch-size' && s.correct);
  const byContender = new Map<ContenderName, Series['points'][number][]>();
  const ceiling: Array<{ x: number; y: number }> = [];
  for (const s of points) {
    const list = byContender.get(s.contender) ?? [];
    list.push({ x: s.x, y: s.msgPerSec });
    byContender.set(s.contender, list);
    if (!ceiling.some((c) => c.x === s.x)) ceiling.push({ x: s.x, y: s.ceilingMsgPerSec });
  }
  const series: Series[] = [
    ...[...byContender].map(([contender, pts]) => ({ name: CONTENDER_LABELS[contender], points: pts })),
    { name: 'ceiling, paired run', points: ceiling },
  ];
  const summary = (c: ContenderName) => results.summary.find((s) => s.contender === c);
  const references = [
    { name: 'naive, main rounds', y: summary('naive')?.msgPerSec ?? Number.NaN },
    { name: '0.75 × ceiling target', y: 0.75 * median(ceiling.map((c) => c.y)) },
  ];
  return renderLineChart({
    title: 'Drain throughput against TALLY_BATCH_SIZE',
    xLabel: 'TALLY_BATCH_SIZE (parts per shard batch, log scale)',
    yLabel: 'messages per second',
    xScale: 'log',
    series,
    references,
  });
}

export function latencyVsLoadChart(results: BenchResults, targetMs: number): string {
  const groups = new Map<string, { contender: ContenderName; x: number; p99: number[] }>();
  for (const l of results.latencies) {
    if (!l.correct || !Number.isFinite(l.p99Ms)) continue;
    const key = `${l.contender}@${l.loadFraction}`;
    const group = groups.get(key) ?? { contender: l.contender, x: l.loadFraction, p99: [] };
    group.p99.push(l.p99Ms);
    groups.set(key, group);
  }
  const byContender = new Map<ContenderName, Array<{ x: number; y: number }>>();
  for (const g of groups.values()) {
    const list = byContender.get(g.contender) ?? [];
    list.push({ x: g.x, y: Math.max(0.5, median(g.p99)) });
    byContender.set(g.contender, list);
  }
  return renderLineChart({
    title: 'p99 end-to-end latency against load',
    xLabel: 'publish rate, as a fraction of the ceiling’s drain rate',
    yLabel: 'p99 latency, ms (log scale)',
    yScale: 'log',
    series: [...byContender].map(([contender, points]) => ({ name: CONTENDER_LABELS[contender], points })),
    references: [{ name: 'target: batch wait + 100 ms', y: targetMs }],
  });
}

/**
 * Marker memory per message in steady state against the marker TTL (the
 * sweep), with the key-per-marker layout this replaced as a reference: its
 * markers live exactly the TTL, so its per-message cost is the same at every
 * TTL (main's drain measured 500 B of markers per message,
 * bench/results/marker-redesign/baseline-main.md).
 */
export const KEY_PER_MARKER_BYTES_PER_MESSAGE = 500;

export function markerMemoryVsTtlChart(results: BenchResults): string {
  const points = (results.markerTtl ?? []).filter((r) => r.problem === undefined && Number.isFinite(r.bytesPerMessage));
  return renderLineChart({
    title: 'Marker memory per message in steady state against the marker TTL',
    xLabel: 'TALLY_MARKER_TTL_S (log scale)',
    yLabel: 'bytes of markers and receipts per message received in one TTL',
    xScale: 'log',
    series: [
      {
        name: `Tally two-step, time-bucketed digest hashes (${points[0]?.rate ?? '?'} msg/s)`,
        points: points.map((r) => ({ x: r.ttlS, y: r.bytesPerMessage })),
      },
    ],
    references: [{ name: 'before: one SET … EX key per marker (main, measured)', y: KEY_PER_MARKER_BYTES_PER_MESSAGE }],
  });
}
