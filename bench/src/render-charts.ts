#!/usr/bin/env node
// Renders the charts of bench/results again from latest.json (and steady-state.json beside it), without a run:
//   node bench/dist/src/render-charts.js [DIR]     (DIR: bench/results)
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BenchResults } from './results.js';
import { chartsOf, readSteadyState } from './write-results.js';

const dir = process.argv[2] ?? fileURLToPath(new URL('../../results', import.meta.url));
const results = JSON.parse(await readFile(join(dir, 'latest.json'), 'utf8')) as BenchResults;
// The latency target, as bench.ts passes it: p99 below TALLY_BATCH_WAIT_MS (default 50) + 100 ms.
for (const [name, svg] of chartsOf(results, 150, await readSteadyState(dir))) {
  await writeFile(join(dir, name), svg);
  process.stdout.write(`wrote ${join(dir, name)}\n`);
}
