/** Writes a run's files: latest.json, latest.md and the two SVG charts; or, for --steady-state, steady-state.json and .md. */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { latencyVsLoadChart, markerMemoryVsTtlChart, throughputVsBatchChart } from './charts.js';
import { renderReport, renderSteadyReport } from './render-table.js';
import type { BenchResults } from './results.js';

const json = (results: BenchResults) =>
  `${JSON.stringify(results, (_, value: unknown) => (typeof value === 'number' && !Number.isFinite(value) ? null : value), 2)}\n`;

/** The steady-state run stored beside a run's files, if any: its fill marks the default TTL on the marker chart. */
export async function readSteadyState(dir: string): Promise<BenchResults | undefined> {
  try {
    return JSON.parse(await readFile(join(dir, 'steady-state.json'), 'utf8')) as BenchResults;
  } catch {
    return undefined;
  }
}

/** The charts of a full run, from its results (and the steady-state run beside them). */
export function chartsOf(results: BenchResults, latencyTargetMs: number, steady: BenchResults | undefined): Array<[string, string]> {
  const charts: Array<[string, string]> = [
    ['throughput-vs-batch.svg', throughputVsBatchChart(results)],
    ['latency-vs-load.svg', latencyVsLoadChart(results, latencyTargetMs)],
  ];
  if ((results.markerTtl ?? []).length > 0) charts.push(['marker-memory-vs-ttl.svg', markerMemoryVsTtlChart(results, steady)]);
  return charts;
}

export async function writeResults(dir: string, results: BenchResults, latencyTargetMs: number): Promise<string[]> {
  await mkdir(dir, { recursive: true });
  // A steady-state run has no latency runs or sweeps of its own (unless asked for): its own files, latest.* left alone.
  if (results.steadyState) {
    const steady: Array<[string, string]> = [
      ['steady-state.json', json(results)],
      ['steady-state.md', renderSteadyReport(results)],
    ];
    for (const [name, text] of steady) await writeFile(join(dir, name), text);
    return steady.map(([name]) => join(dir, name));
  }
  const files: Array<[string, string]> = [
    ['latest.json', json(results)],
    ['latest.md', renderReport(results)],
    ...chartsOf(results, latencyTargetMs, await readSteadyState(dir)),
  ];
  for (const [name, text] of files) await writeFile(join(dir, name), text);
  return files.map(([name]) => join(dir, name));
}
