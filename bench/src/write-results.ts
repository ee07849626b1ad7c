/** Writes a run's files: latest.json, latest.md and the two SVG charts. */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { latencyVsLoadChart, markerMemoryVsTtlChart, throughputVsBatchChart } from './charts.js';
import { renderReport } from './render-table.js';
import type { BenchResults } from './results.js';

export async function writeResults(dir: string, results: BenchResults, latencyTargetMs: number): Promise<string[]> {
  await mkdir(dir, { recursive: true });
  const files: Array<[string, string]> = [
    ['latest.json', `${JSON.stringify(results, (_, value: unknown) => (typeof value === 'number' && !Number.isFinite(value) ? null : value), 2)}\n`],
    ['latest.md', renderReport(results)],
    ['throughput-vs-batch.svg', throughputVsBatchChart(results)],
    ['latency-vs-load.svg', latencyVsLoadChart(results, latencyTargetMs)],
  ];
  if ((results.markerTtl ?? []).length > 0) files.push(['marker-memory-vs-ttl.svg', markerMemoryVsTtlChart(results)]);
  for (const [name, text] of files) await writeFile(join(dir, name), text);
  return files.map(([name]) => join(dir, name));
}
