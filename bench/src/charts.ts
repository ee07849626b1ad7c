/** Pure: the two charts of a run, from its records. */
import { CONTENDER_LABELS, type BenchResults, type ContenderName } from './results.js';
import { renderLineChart, tickText, type Series } from './render-svg.js';
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
 * sweep), with one SET … EX key per marker as a reference: such markers live
 * exactly the TTL, so their per-message cost is the same at every TTL (a
 * drain with that layout measured 500 B of markers per message,
 * bench/results/marker-redesign/baseline-main.md).
 */
export const KEY_PER_MARKER_BYTES_PER_MESSAGE = 500;

/**
 * The marker memory per message at the default TTL from a steady-state run
 * (--steady-state): the population it filled for two-step, over the messages
 * received in one TTL at its rate. Taken otherwise than the sweep (a
 * snapshot, not an average over a TTL), so it is drawn as a point of its own.
 */
export function steadyStatePoint(steady: BenchResults | undefined): { x: number; y: number; rate: number; liveBuckets: number } | null {
  const fill = steady?.drains.find((d) => d.variant === 'steady' && d.contender === 'tally-two-step' && d.steady !== undefined)?.steady;
  if (fill === undefined || !(fill.rate > 0) || !(fill.markerTtlS > 0)) return null;
  const liveBuckets = fill.liveBuckets - 1 + fill.currentFraction;
  return { x: fill.markerTtlS, y: fill.fillBytes / (fill.rate * fill.markerTtlS), rate: fill.rate, liveBuckets };
}

export function markerMemoryVsTtlChart(results: BenchResults, steady?: BenchResults): string {
  const points = (results.markerTtl ?? []).filter((r) => r.problem === undefined && Number.isFinite(r.bytesPerMessage));
  const atDefault = steadyStatePoint(steady);
  const series: Series[] = [
    {
      name: `Tally two-step, TTL sweep (${points[0]?.rate ?? '?'} msg/s)`,
      points: points.map((r) => ({ x: r.ttlS, y: r.bytesPerMessage })),
    },
  ];
  const caption = ['Line: published at its rate for 2.5 TTL, used_memory averaged over the last TTL, per message of one TTL.'];
  if (atDefault !== null) {
    series.push({
      name: `steady state at the default TTL (steady-state bench, ${tickText(atDefault.rate)} msg/s)`,
      points: [{ x: atDefault.x, y: atDefault.y, label: `${Math.round(atDefault.y)} B at ${atDefault.x} s` }],
      line: false,
      shape: 'diamond',
    });
    caption.push(
      `Diamond: not swept (a 600 s point takes over 25 minutes). The population the steady-state bench filled,`,
      `${atDefault.liveBuckets.toFixed(2)} of the 2 to 3 live buckets, per message of one TTL: a snapshot, not an average over a TTL.`,
    );
  }
  return renderLineChart({
    title: 'Marker memory per message in steady state against the marker TTL',
    xLabel: 'TALLY_MARKER_TTL_S (log scale)',
    yLabel: 'bytes of markers and receipts per message received in one TTL',
    xScale: 'log',
    series,
    references: [{ name: 'one SET … EX key per marker (measured)', y: KEY_PER_MARKER_BYTES_PER_MESSAGE }],
    caption,
  });
}
