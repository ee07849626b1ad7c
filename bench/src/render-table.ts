/**
 * Pure: the Markdown tables printed at the end of a run and written to
 * bench/results/latest.md.
 */
import type { BenchResults, ContenderSummary, DrainRecord, SweepRecord } from './results.js';

/** A number for a table cell: `n/a` for NaN, thousands separated, fixed decimals. */
export function cell(value: number, decimals = 0, suffix = ''): string {
  if (!Number.isFinite(value)) return 'n/a';
  const fixed = value.toFixed(decimals);
  const [whole, fraction] = fixed.split('.');
  const grouped = whole!.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return `${grouped}${fraction !== undefined ? `.${fraction}` : ''}${suffix}`;
}

export function markdownTable(header: readonly string[], rows: ReadonlyArray<readonly string[]>): string {
  const escape = (text: string) => text.replace(/\|/g, '\\|').replace(/\n/g, ' ');
  const line = (cells: readonly string[]) => `| ${cells.map(escape).join(' | ')} |`;
  return [line(header), `|${header.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`, ...rows.map(line)].join('\n');
}

export function renderSummaryTable(summary: readonly ContenderSummary[]): string {
  // CPU s per million messages is the same number as CPU µs per message; the column says the latter.
  const header = [
    'contender',
    'msg/s',
    '× ceiling',
    '× naive',
    '× batched',
    'p50 ms',
    'p99 ms',
    'CPU µs / msg',
    'main thread µs / msg',
    'Redis CPU µs / msg',
    'peak RSS MB',
    'Redis cmds / msg',
    'Redis B / msg',
    'marker B / msg',
    'counted correctly',
  ];
  const rows = summary.map((s) => [
    s.label,
    cell(s.msgPerSec),
    cell(s.ratioToCeiling, 2),
    cell(s.ratioToNaive, 2),
    cell(s.ratioToBatched, 2),
    cell(s.p50Ms, 1),
    cell(s.p99Ms, 1),
    cell(s.cpuSecondsPerMillion, 1),
    cell(s.mainThreadCpuUsPerMessage, 1),
    cell(s.redisCpuUsPerMessage, 1),
    cell(s.peakRssMb, 0),
    cell(s.redisCommandsPerMessage, 2),
    cell(s.redisBytesPerMessage, 0),
    cell(s.markerBytesPerMessage, 0),
    s.correct ? 'yes' : 'NO',
  ]);
  return markdownTable(header, rows);
}

/**
 * The fresh and steady-state figures side by side: the references, then
 * each Tally mode fresh and on the steady-state population.
 */
export function renderSteadyTable(summary: readonly ContenderSummary[]): string {
  const header = [
    'contender',
    'msg/s',
    '× ceiling',
    '× batched',
    'CPU µs / msg',
    'main thread µs / msg',
    'Redis CPU µs / msg',
    'Redis CPU × batched',
    'Redis cmds / msg',
    'Redis B / msg',
    'markers held before',
    'warm-up s (msg/s)',
    'counted correctly',
  ];
  const byContender = (s: ContenderSummary) => summary.findIndex((t) => t.contender === s.contender);
  const order = [...summary].sort((a, b) => byContender(a) - byContender(b) || (a.variant === b.variant ? 0 : a.variant === 'fresh' ? -1 : 1));
  const rows = order.map((s) => [
    s.label,
    cell(s.msgPerSec),
    cell(s.ratioToCeiling, 2),
    cell(s.ratioToBatched, 2),
    cell(s.cpuSecondsPerMillion, 1),
    cell(s.mainThreadCpuUsPerMessage, 1),
    cell(s.redisCpuUsPerMessage, 1),
    cell(s.redisCpuToBatched, 2),
    cell(s.redisCommandsPerMessage, 2),
    cell(s.redisBytesPerMessage, 0),
    Number.isFinite(s.steadyMarkers) ? `${cell(s.steadyMarkers / 1e6, 1)} M` : '0',
    Number.isFinite(s.warmupSeconds) ? `${cell(s.warmupSeconds, 2)} (${cell(s.warmupMsgPerSec)})` : 'none',
    s.correct ? 'yes' : 'NO',
  ]);
  return markdownTable(header, rows);
}

/** Per steady-state drain: the population it started on and what the fill took. */
export function renderFillTable(results: Pick<BenchResults, 'drains'>): string {
  const header = [
    'round',
    'contender',
    'rate msg/s',
    'parts / msg',
    'live buckets',
    'current bucket full',
    'markers',
    'hashes',
    'sub-buckets',
    'fill s',
    'fill MB',
    'layout found',
  ];
  const rows = results.drains
    .filter((d) => d.steady !== undefined)
    .map((d) => {
      const f = d.steady!;
      return [
        String(d.round + 1),
        d.contender,
        cell(f.rate),
        cell(f.partsPerMessage, 2),
        String(f.liveBuckets),
        `${cell(f.currentFraction * 100, 0)} %`,
        cell(f.markers),
        cell(f.hashes),
        f.subBuckets[0] === f.subBuckets[1] ? String(f.subBuckets[0]) : `${f.subBuckets[0]}–${f.subBuckets[1]}`,
        cell(f.fillSeconds, 1),
        cell(f.fillBytes / 1e6, 0),
        f.layoutFound ? 'yes' : 'NO',
      ];
    });
  return markdownTable(header, rows);
}

/**
 * Per drain, where Redis's CPU went: the commands that took the most microseconds per message (INFO commandstats;
 * a script's own commands count both in them and in evalsha), beside the CPU itself and, for Tally, the mean
 * parts per shard batch in the window (what the per-batch costs are spread over).
 */
export function renderCommandTimeTable(results: Pick<BenchResults, 'drains'>, top = 6, topologyOf?: (drain: DrainRecord) => string): string {
  const rows = results.drains
    .filter((d) => d.redisDetail?.commandUsec !== undefined && d.redisCpuSeconds !== null && d.messages > 0)
    .map((d) => {
      const perMessage = Object.entries(d.redisDetail!.commandUsec!)
        .filter(([command]) => command !== 'info')
        .map(([command, usec]) => [command, usec / d.messages] as const)
        .filter(([, usec]) => usec >= 0.005)
        .sort((a, b) => b[1] - a[1]);
      const shown = perMessage.slice(0, top).map(([command, usec]) => `${command} ${usec.toFixed(2)}`);
      const rest = perMessage.slice(top).reduce((sum, [, usec]) => sum + usec, 0);
      return [
        String(d.round + 1),
        ...(topologyOf ? [topologyOf(d)] : []),
        `${d.contender}${d.variant === 'steady' ? ', steady' : ''}`,
        cell((d.redisCpuSeconds! * 1e6) / d.messages, 2),
        d.partsPerBatch === undefined ? 'n/a' : cell(d.partsPerBatch, 0),
        [...shown, ...(rest > 0 ? [`others ${rest.toFixed(2)}`] : [])].join(', ') || 'none',
      ];
    });
  return markdownTable(
    ['round', ...(topologyOf ? ['topology'] : []), 'drain', 'Redis CPU µs / msg', 'parts / batch', 'µs / msg by command (a script holds its commands)'],
    rows,
  );
}

/** The whole steady-state.md. */
export function renderSteadyReport(results: BenchResults): string {
  const w = results.options as { workload?: Record<string, unknown>; steadyRate?: number; steadyPhase?: number | null; warmupMessages?: number } | undefined;
  const phase =
    typeof w?.steadyPhase === 'number'
      ? ` Every Tally contender's bucket of now is filled ${cell(w.steadyPhase * 100, 0)} % full (--steady-phase), whatever the clock.`
      : '';
  return [
    `# Tally benchmark: fresh and steady state`,
    '',
    `${results.startedAt} to ${results.finishedAt}; ${results.machine.cpus} cores, Node ${results.machine.node}, private redis-server ${results.machine.redis}; ${results.rounds} round(s), contenders alternating; medians over rounds, ratios taken pair by pair within a round against the fresh ceiling and batched drains.`,
    '',
    w?.workload ? `Workload: \`${JSON.stringify(w.workload)}\`; warm-up: ${w.warmupMessages ?? 0} messages per drain, outside the window.` : '',
    `Steady state: before its drain, the prefix holds the marker population the marker TTL holds at ${cell(w?.steadyRate ?? Number.NaN)} msg/s.${phase}`,
    '',
    renderSteadyTable(results.summary),
    '',
    '## Steady-state fills',
    '',
    renderFillTable(results),
    '',
    '## Redis time by command',
    '',
    renderCommandTimeTable(results),
    '',
    ...(results.problems.length > 0 ? ['## Problems', '', ...results.problems.map((p) => `- ${p}`), ''] : []),
  ].join('\n');
}

export function renderSweepTable(sweeps: readonly SweepRecord[]): string {
  const header = ['sweep', 'setting', 'contender', 'msg/s', 'ceiling msg/s', '× ceiling', 'correct'];
  const rows = sweeps.map((s) => [
    s.sweep,
    s.label,
    s.contender,
    cell(s.msgPerSec),
    cell(s.ceilingMsgPerSec),
    cell(s.ratioToCeiling, 2),
    s.correct ? 'yes' : 'NO',
  ]);
  return markdownTable(header, rows);
}

export function renderLatencyTable(results: Pick<BenchResults, 'latencies'>): string {
  const header = ['contender', 'load (× ceiling rate)', 'rate msg/s', 'p50 ms', 'p99 ms', 'max ms', 'samples', 'method', 'round'];
  const rows = results.latencies.map((l) => [
    l.contender,
    cell(l.loadFraction, 2),
    cell(l.achievedRate),
    cell(l.p50Ms, 1),
    cell(l.p99Ms, 1),
    cell(l.maxMs, 1),
    cell(l.samples),
    l.method,
    l.round === null ? 'sweep' : String(l.round + 1),
  ]);
  return markdownTable(header, rows);
}

/** The whole latest.md. */
export function renderReport(results: BenchResults): string {
  const w = results.options as { workload?: Record<string, unknown> } | undefined;
  const parts = [
    `# Tally benchmark (${results.quick ? 'quick' : 'full'} run)`,
    '',
    `${results.startedAt} to ${results.finishedAt}; ${results.machine.cpus} cores, Node ${results.machine.node}, private redis-server ${results.machine.redis}; ${results.rounds} round(s), contenders alternating; medians over rounds, ratios taken pair by pair within a round.`,
    '',
    w?.workload ? `Workload: \`${JSON.stringify(w.workload)}\`` : '',
    '',
    renderSummaryTable(results.summary),
    '',
  ];
  if (results.sweeps.length > 0)
    parts.push('## Sweeps (Tally, each point paired with a ceiling drain of the same workload)', '', renderSweepTable(results.sweeps), '');
  if (results.latencies.length > 0) parts.push('## Latency runs', '', renderLatencyTable(results), '');
  if ((results.markerTtl ?? []).length > 0) {
    parts.push(
      '## Marker memory in steady state against the marker TTL (Tally two-step)',
      '',
      markdownTable(
        ['TTL s', 'rate msg/s', 'marker + receipt MB (mean over the last TTL)', 'B per message received in one TTL', 'samples'],
        (results.markerTtl ?? []).map((r) => [String(r.ttlS), cell(r.rate), cell(r.markerBytes / 1e6, 2), cell(r.bytesPerMessage, 0), String(r.samples)]),
      ),
      '',
    );
  }
  if (results.problems.length > 0) parts.push('## Problems', '', ...results.problems.map((p) => `- ${p}`), '');
  return parts.join('\n');
}
