#!/usr/bin/env node
/**
 * `pnpm bench`: parses the flags and dispatches. Exit codes: 0 every
 * contender started, ran and counted correctly, 1 one did not (or the run
 * failed), 2 a usage error. Speeds never decide the exit code.
 */
import { fileURLToPath } from 'node:url';
import { liveChildren } from './contenders.js';
import { parseBenchArgs, USAGE, type BenchOptions } from './options.js';
import { runProfile, summarizeProfiles } from './profile-run.js';
import { renderSteadyTable, renderSummaryTable } from './render-table.js';
import { runBench } from './run-bench.js';
import { runScaleOut } from './scale-out-run.js';
import { runPartitions } from './partitions-run.js';
import { runShapeCost } from './shape-cost-run.js';
import { runNaturalCheck } from './natural-check-run.js';
import { writeResults } from './write-results.js';

const RESULTS = fileURLToPath(new URL('../../results', import.meta.url));
const started = performance.now();
const log = (line: string) => process.stdout.write(`[${((performance.now() - started) / 1000).toFixed(1).padStart(6)} s] ${line}\n`);

let options: BenchOptions;
try {
  options = parseBenchArgs(process.argv.slice(2), process.env);
} catch (error) {
  process.stderr.write(`bench: ${error instanceof Error ? error.message : String(error)}\n${USAGE}\n`);
  process.exit(2);
}

// An interrupted bench kills exactly the children it started, nothing else.
let interrupted = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (interrupted) process.exit(130);
    interrupted = true;
    log(`bench: ${signal}: stopping ${liveChildren.size} child process(es)`);
    for (const child of liveChildren) child.kill('SIGKILL');
    process.exit(130);
  });
}

try {
  switch (options.command) {
    case 'help':
      log(USAGE);
      break;
    case 'summarize-profiles':
      log(await summarizeProfiles(options.profileDir!));
      break;
    case 'profile':
      process.exitCode = await runProfile(options, options.profileDir ?? `${RESULTS}/profile`, log);
      break;
    case 'scale-out':
      process.exitCode = await runScaleOut(options, options.outDir ?? (options.quick ? `${RESULTS}/quick` : RESULTS), log);
      break;
    case 'partitions':
      process.exitCode = await runPartitions(options, options.outDir ?? (options.quick ? `${RESULTS}/quick` : RESULTS), log);
      break;
    case 'shape-cost':
      process.exitCode = await runShapeCost(options, options.outDir ?? (options.quick ? `${RESULTS}/quick` : RESULTS), log);
      break;
    case 'natural-check':
      process.exitCode = await runNaturalCheck(options, options.outDir ?? `${RESULTS}/natural-check`, log);
      break;
    case 'run': {
      const { results, exitCode } = await runBench(options, log);
      const dir = options.outDir ?? (options.quick ? `${RESULTS}/quick` : RESULTS);
      // The latency target (docs/benchmark.md): p99 below TALLY_BATCH_WAIT_MS (default 50) + 100 ms.
      const written = await writeResults(dir, results, 150);
      process.stdout.write(`\n${results.steadyState ? renderSteadyTable(results.summary) : renderSummaryTable(results.summary)}\n\n`);
      for (const p of results.problems) log(`problem: ${p}`);
      log(`wrote ${written.join(', ')}`);
      log(exitCode === 0 ? 'bench: every contender started, ran and counted correctly' : 'bench: FAILED: a contender did not start, did not run or miscounted');
      process.exitCode = exitCode;
      break;
    }
  }
} catch (error) {
  process.stderr.write(`bench: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  for (const child of liveChildren) child.kill('SIGKILL');
  process.exitCode = 1;
}
// Every connection is closed by now; a stray timer must not hold the exit (CI waits on it).
process.exit(process.exitCode ?? 0);
