#!/usr/bin/env node
/**
 * `pnpm tally <command>`: read counts and counters, publish a workload.
 * Honours the same TALLY_* variables as the daemon.
 */
import { parseArgs } from 'node:util';
import { CliUsageError, loadConfig } from '@tally/shared';
import { createRedisClient } from '@tally/worker';
import { countsToJson, readCounts } from './commands/counts.js';
import { deviationEstimate, deviationText } from './commands/deviation.js';
import { publishCommand } from './commands/publish.js';
import { readStatsReport } from './commands/stats.js';
import { statusCommand } from './commands/status.js';
import { readTruth, verify } from './commands/verify.js';
import { explainRedisFailures } from './redis-probe.js';

const USAGE = `usage: tally <command> [options]

commands:
  counts [--json] [--sku S ...]   counts per SKU under TALLY_PREFIX (all, or the SKUs named)
  stats [--json]                  the prefix's mode and accumulated counters (received, duplicates,
                                  occupation_failures: null in atomic mode, where it cannot happen, ...)
  verify --truth FILE [--exact]   compare the counts with a truth file (exit 1 if any SKU is below it,
                                  or with --exact if any differs)
  deviation --crashes-per-month N --recovery p50=90s,p90=5m,p99=20m [--json]
                                  expected overcount per month and its bound, each term shown, from the
                                  counters, TALLY_MARKER_TTL_S, TALLY_BATCH_SIZE, TALLY_PREFETCH and
                                  TALLY_VIRTUAL_SHARDS, and the crash pattern (percentiles: pNN, min, max)
  status [--json]                 live daemons (host, pid, mode, version, consuming, oldest unacked age,
                                  last beat), the prefix's layout, the queue's depth and consumers
  publish [options]               publish a generated workload to TALLY_QUEUE
      --messages N (10000)  --skus N (1000)  --changes MIN-MAX (1-8)  --deltas MIN-MAX (1-9)
      --duplicate-rate R (0.02)  --bad-rate R (0)  --types a,b  --zipf S (0)  --seed N
      --id-prefix P  --truth FILE (write the expected counts as JSON)

Environment: TALLY_REDIS_URL, TALLY_AMQP_URL, TALLY_QUEUE, TALLY_PREFIX, TALLY_VIRTUAL_SHARDS, ... (see README)`;

// `tally counts | head` closes the pipe early: that is a normal end, not an error.
process.stdout.on('error', (error: NodeJS.ErrnoException) => {
  if (error.code === 'EPIPE') process.exit(0);
  throw error;
});

function out(line: string): void {
  process.stdout.write(`${line}\n`);
}

async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  if (command === undefined || command === 'help' || command === '--help' || command === '-h') {
    out(USAGE);
    return;
  }
  const config = loadConfig(process.env);
  if (command === 'publish') {
    const { values } = parseArgs({
      args: rest,
      options: {
        messages: { type: 'string' },
        skus: { type: 'string' },
        changes: { type: 'string' },
        deltas: { type: 'string' },
        'duplicate-rate': { type: 'string' },
        'bad-rate': { type: 'string' },
        seed: { type: 'string' },
        types: { type: 'string' },
        zipf: { type: 'string' },
        'id-prefix': { type: 'string' },
        truth: { type: 'string' },
      },
      strict: true,
    });
    await publishCommand(values, config, out);
    return;
  }
  if (command === 'status') {
    const { values } = parseArgs({ args: rest, options: { json: { type: 'boolean', default: false } }, strict: true });
    await statusCommand(config, values.json, out);
    return;
  }
  if (command === 'deviation') {
    const { values } = parseArgs({
      args: rest,
      options: { json: { type: 'boolean', default: false }, 'crashes-per-month': { type: 'string' }, recovery: { type: 'string' } },
      strict: true,
    });
    const redis = createRedisClient(config.redisUrl, 'tally-cli', { maxRetriesPerRequest: 0, retryStrategy: () => null });
    // A wrong password or an untrusted certificate reads as its fix, not as "Connection is closed".
    const explain = explainRedisFailures(redis);
    try {
      const estimate = await deviationEstimate(redis, config, values);
      out(values.json ? JSON.stringify(estimate) : deviationText(estimate, config.prefix));
    } catch (error) {
      throw explain(error);
    } finally {
      redis.disconnect();
    }
    return;
  }
  if (command !== 'counts' && command !== 'stats' && command !== 'verify') throw new CliUsageError(`unknown command ${JSON.stringify(command)}\n${USAGE}`);
  const { values } = parseArgs({
    args: rest,
    options: {
      json: { type: 'boolean', default: false },
      sku: { type: 'string', multiple: true },
      truth: { type: 'string' },
      exact: { type: 'boolean', default: false },
    },
    strict: true,
  });
  if (values.sku && command !== 'counts') throw new CliUsageError('--sku applies to counts only');
  if (command === 'verify' && !values.truth) throw new CliUsageError('verify needs --truth FILE');
  // One attempt, no endless reconnects: a CLI should fail fast and say why.
  const redis = createRedisClient(config.redisUrl, 'tally-cli', { maxRetriesPerRequest: 0, retryStrategy: () => null });
  const explain = explainRedisFailures(redis);
  try {
    if (command === 'verify') {
      const verdict = verify(await readCounts(redis, config, []), await readTruth(values.truth!));
      if (values.json) out(JSON.stringify(verdict));
      else {
        out(`${verdict.skus} SKUs: ${verdict.exact} exact, ${verdict.below} below the truth (${verdict.missingUnits} units lost), ${verdict.above} above it (${verdict.excessUnits} units overcounted)`);
      }
      if (verdict.below > 0 || (values.exact && verdict.above > 0)) process.exitCode = 1;
    } else if (command === 'counts') {
      const counts = await readCounts(redis, config, values.sku ?? []);
      if (values.json) out(countsToJson(counts));
      else for (const [sku, value] of [...counts].sort(([a], [b]) => (a < b ? -1 : 1))) out(`${sku}\t${value}`);
    } else {
      const stats = await readStatsReport(redis, config);
      if (values.json) out(JSON.stringify(stats));
      else {
        for (const [name, value] of Object.entries(stats)) {
          const shown = value === null && name === 'occupation_failures' ? 'n/a (atomic mode: counts and markers are written in one step)' : value;
          out(`${name.padEnd(22)} ${shown}`);
        }
      }
    }
  } catch (error) {
    throw explain(error);
  } finally {
    redis.disconnect();
  }
}

main(process.argv.slice(2)).catch((error: unknown) => {
  const message = error instanceof Error ? error.message : String(error);
  process.stderr.write(`tally: ${message}\n`);
  process.exit(error instanceof CliUsageError ? 64 : 1);
});
