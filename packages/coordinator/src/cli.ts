#!/usr/bin/env node
/**
 * `pnpm tally <command>`: read counts and counters, publish a workload,
 * list and replay dead letters.
 * Honours the same TALLY_* variables as the daemon.
 */
import { parseArgs } from 'node:util';
import { CliUsageError, loadConfig } from '@tally/shared';
import { startTracing } from '@tally/runtime';
import { countsToJson, readCounts } from './commands/counts.js';
import {
  deadList,
  deadListText,
  deadReplay,
  deadReplayText,
  deadReplayWarning,
  deadSubcommand,
  EXIT_REPLAY_REFUSED,
  recordedStandingIn,
} from './commands/dead.js';
import { deviationEstimate, deviationText } from './commands/deviation.js';
import { publishCommand } from './commands/publish.js';
import { readStatsReport, statsText } from './commands/stats.js';
import { statusCommand } from './commands/status.js';
import { streamReset, streamResetText } from './commands/stream.js';
import { readTruth, verify } from './commands/verify.js';
import { openCliRedis, withCliRedis } from './redis/cli-redis.js';

/** One help text per command: `tally <command> --help` prints it. */
const HELP = Object.freeze({
  counts: `usage: tally counts [--json] [--sku S ...]
  counts per SKU under TALLY_PREFIX (all, or the SKUs named)
  --json     one JSON object mapping each SKU to its integer count
  --sku S    only this SKU (repeatable)`,
  stats: `usage: tally stats [--json]
  the prefix's mode and accumulated counters (received, duplicates, occupation_failures: null in
  atomic mode, where it cannot happen, ...), totals across restarts and daemons
  --json     one JSON object`,
  verify: `usage: tally verify --truth FILE [--exact] [--json]
  compare the counts with a truth file (exit 1 if any SKU is below it, or with --exact if any differs)`,
  deviation: `usage: tally deviation --crashes-per-month N --recovery p50=90s,p90=5m,p99=20m [--json]
  expected overcount per month and its bound, each term shown, from the counters, TALLY_MARKER_TTL_S,
  TALLY_BATCH_SIZE, TALLY_PREFETCH and TALLY_VIRTUAL_SHARDS, and the crash pattern (percentiles: pNN, min, max)`,
  publish: `usage: tally publish [options]
  publish a generated workload to TALLY_QUEUE (progress on stderr when it is a terminal)
  --messages N (10000)  --skus N (1000)  --changes MIN-MAX (1-8)  --deltas MIN-MAX (1-9)
  --duplicate-rate R (0.02)  --bad-rate R (0)  --types a,b  --zipf S (0)  --seed N
  --id-prefix P  --truth FILE (write the expected counts as JSON)
  --shape contract|foreign (contract): foreign publishes {"eventId","warehouse","lines":[{"product":{"sku"},"qty","reason"}]},
    a tenth with the id in the x-event-id header, its truth keyed <warehouse>:<sku>; the daemon reads it with
    TALLY_MESSAGE_MAPPING set as the README's example (docs/operations.md)
  with tracing on (OTEL_* as for the daemon) each message gets a producer span and its traceparent header`,
  dead: `usage: tally dead list [--json] [--reason CODE] [--limit N]
       tally dead replay [--reason CODE] [--limit N] [--force] [--json]
  list      counts of <TALLY_QUEUE>.dead by reason, and the first N (20) messages with id and reason;
            the messages are read and requeued in one step, in their order (docs/operations.md)
  replay    move the matching dead letters (all, or --reason CODE, at most --limit N) back to TALLY_QUEUE:
            each copy is confirmed by the broker before the dead one is removed; the rest stay in order.
            A dead letter that may have been counted (count-refused, delivery-limit, rejected, expired,
            maxlen, unknown) is kept in place once its markers may have expired (older than
            TALLY_MARKER_TTL_S): one line on stderr names the overcount it risks, exit 3. So, at any age, is a
            count-refused one whose undo on another count shard Redis refused (undo_failures; a cluster):
            stderr names each key and the INCRBY that subtracts what stands, for a repaired value that
            includes it; then --force
  --force   replay those too (each may be counted twice); said on stderr, counted as forced_replays
  CODE      a reason code (oversized-body, malformed-json, missing-id, count-refused, delivery-limit, ...
            see README) or "unknown"`,
  stream: `usage: tally stream reset --partition P [--force] [--json]
  TALLY_SOURCE=stream: forget partition P's checkpoint and watermarks, so its next owner counts its stream from the
  first message. For a stream that was deleted and recreated (the daemon refuses it and names this command); refused
  when the stream is still the one checkpointed (it would all be counted again) unless --force`,
  status: `usage: tally status [--json]
  live daemons from their heartbeats (host, pid, mode, version, consuming, the RabbitMQ node each is on,
  oldest unacked age, last beat), the prefix's layout, and the queue's depth and consumers
  (asked of the first node of TALLY_AMQP_URL that answers)
  --json     one JSON object`,
} as const);

type Command = keyof typeof HELP;

const USAGE = `usage: tally <command> [options]   (tally <command> --help for its options)

commands:
  counts      counts per SKU under TALLY_PREFIX
  stats       the mode and the accumulated counters
  verify      compare the counts with a truth file
  deviation   expected overcount per month, and its bound
  publish     publish a generated workload to TALLY_QUEUE
  status      live daemons, the layout, the queue's depth and consumers
  dead        list or replay <TALLY_QUEUE>.dead
  stream      reset a stream partition that was deleted and recreated

Environment: TALLY_REDIS_URL, TALLY_AMQP_URL, TALLY_QUEUE, TALLY_PREFIX, TALLY_VIRTUAL_SHARDS, ... (see README)`;

function isCommand(name: string): name is Command {
  return Object.hasOwn(HELP, name);
}

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
  if (!isCommand(command)) throw new CliUsageError(`unknown command ${JSON.stringify(command)}\n${USAGE}`);
  if (rest.includes('--help') || rest.includes('-h')) {
    out(HELP[command]);
    return;
  }
  const config = loadConfig(process.env);
  if (command === 'dead') {
    const [sub, ...flags] = rest;
    const { values } = parseArgs({
      args: flags,
      options: {
        json: { type: 'boolean', default: false },
        reason: { type: 'string' },
        limit: { type: 'string' },
        force: { type: 'boolean', default: false },
      },
      strict: true,
    });
    const subcommand = deadSubcommand(sub);
    if (values.force && subcommand !== 'replay') throw new CliUsageError('--force applies to dead replay only');
    if (subcommand === 'list') {
      // Redis for the standing counts recorded for count-refused letters; a Redis that does not answer does not stop the list.
      const redis = await openCliRedis(config.redisUrl).catch((error: unknown) => ({ unread: error instanceof Error ? error.message : String(error) }));
      try {
        const report = await deadList(values, config, 'unread' in redis ? redis : recordedStandingIn(redis, config.prefix));
        out(values.json ? JSON.stringify(report) : deadListText(report));
        if (values.json && report.standingRecordsUnread !== undefined)
          process.stderr.write(`tally: standing counts recorded in Redis not read (${report.standingRecordsUnread})\n`);
      } finally {
        if (!('unread' in redis)) redis.disconnect();
      }
      return;
    }
    // Redis for the prefix's marker layout and the forced_replays counter (commands/dead.ts).
    const report = await withCliRedis(config.redisUrl, (redis) => deadReplay(values, config, redis));
    out(values.json ? JSON.stringify(report) : deadReplayText(report));
    const warning = deadReplayWarning(report);
    if (warning !== null) process.stderr.write(`tally: ${warning}\n`);
    if (report.refused.messages > 0 || report.withoutPartition > 0) process.exitCode = EXIT_REPLAY_REFUSED;
    return;
  }
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
        shape: { type: 'string' },
      },
      strict: true,
    });
    // Producer spans only when the standard OTEL_* variables ask for traces, as for the daemon.
    const tracing = await startTracing(process.env, 'tally-publish');
    try {
      await publishCommand(values, config, out);
    } finally {
      await tracing?.shutdown();
    }
    return;
  }
  if (command === 'stream') {
    const [sub, ...flags] = rest;
    if (sub !== 'reset') throw new CliUsageError(`unknown stream subcommand ${JSON.stringify(sub)}\n${HELP.stream}`);
    const { values } = parseArgs({
      args: flags,
      options: { partition: { type: 'string' }, force: { type: 'boolean', default: false }, json: { type: 'boolean', default: false } },
      strict: true,
    });
    const report = await withCliRedis(config.redisUrl, (redis) => streamReset(redis, config, values));
    out(values.json ? JSON.stringify(report) : streamResetText(report));
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
    const estimate = await withCliRedis(config.redisUrl, (redis) => deviationEstimate(redis, config, values));
    out(values.json ? JSON.stringify(estimate) : deviationText(estimate, config.prefix));
    return;
  }
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
  await withCliRedis(config.redisUrl, async (redis) => {
    if (command === 'verify') {
      const verdict = verify(await readCounts(redis, config, []), await readTruth(values.truth!));
      if (values.json) out(JSON.stringify(verdict));
      else {
        out(
          `${verdict.skus} SKUs: ${verdict.exact} exact, ${verdict.below} below the truth (${verdict.missingUnits} units lost), ${verdict.above} above it (${verdict.excessUnits} units overcounted)`,
        );
      }
      if (verdict.below > 0 || (values.exact && verdict.above > 0)) process.exitCode = 1;
    } else if (command === 'counts') {
      const counts = await readCounts(redis, config, values.sku ?? []);
      if (values.json) out(countsToJson(counts));
      else for (const [sku, value] of [...counts].sort(([a], [b]) => (a < b ? -1 : 1))) out(`${sku}\t${value}`);
    } else {
      const stats = await readStatsReport(redis, config);
      out(values.json ? JSON.stringify(stats) : statsText(stats));
    }
  });
}

main(process.argv.slice(2)).catch((error: unknown) => {
  const message = error instanceof Error ? error.message : String(error);
  process.stderr.write(`tally: ${message}\n`);
  process.exit(error instanceof CliUsageError ? 64 : 1);
});
