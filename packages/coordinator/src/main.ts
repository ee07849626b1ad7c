#!/usr/bin/env node
/**
 * The daemon's entry point: the one place that reads the environment and
 * handles signals. Exit codes (docs/operations.md, "Exit codes"):
 *
 *   0   stopped by a signal; whatever did not finish in the grace period stays
 *       unacked and is redelivered
 *   1   start refused (a Redis or broker that cannot keep the promise, a
 *       layout or mode mismatch) or a fatal error while running
 *   2   configuration error (one line naming the variable)
 *   70  EX_SOFTWARE: a bug of Tally's own (invariant 13, bug-exit.ts: the
 *       stack logged once at level fatal, nothing acked after it), or a forced
 *       exit (the stop did not end within TALLY_SHUTDOWN_GRACE_MS plus
 *       SHUTDOWN_MARGIN_MS, or a second signal); unfinished work stays unacked
 */
import { classifyError, isTallyError, loadConfig, loadFaultInjection, type FaultInjection, type TallyConfig } from '@tally/shared';
import { startTracing } from '@tally/runtime';
import { EX_SOFTWARE, exitOnBug } from './process/bug-exit.js';
import { CLOSE_BUDGET_MS, Daemon } from './daemon.js';
import { createLogger } from './process/logger.js';
import { linkShortfallLine, producerLinkShortfall } from './telemetry/link-limit.js';

/** Exit codes, as documented above. */
const EXIT = Object.freeze({ stopped: 0, fatal: 1, config: 2, forced: EX_SOFTWARE });
/**
 * The backstop after the grace period: the daemon's own closing steps are
 * bounded by CLOSE_BUDGET_MS in total; this is the last resort if something
 * unbounded (a bug, a blocked event loop) still holds the stop.
 */
const SHUTDOWN_MARGIN_MS = CLOSE_BUDGET_MS + 1_500;

function fail(code: number, line: string): never {
  process.stderr.write(`tally: ${line}\n`);
  process.exit(code);
}

let config: TallyConfig;
let faults: FaultInjection;
try {
  config = loadConfig(process.env);
  faults = loadFaultInjection(process.env);
} catch (error) {
  fail(EXIT.config, `configuration error: ${error instanceof Error ? error.message : String(error)}`);
}

const log = createLogger(config.logLevel, { component: 'coordinator' });
// Before the daemon, so its tracer is the SDK's; off unless OTEL_* asks for traces.
const tracing = await startTracing(process.env);
if (tracing)
  log.info(
    {
      exporter: process.env.OTEL_TRACES_EXPORTER ?? 'otlp',
      protocol: process.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? process.env.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf',
    },
    'tracing on',
  );
// A batch span keeps OTEL_SPAN_LINK_COUNT_LIMIT producer links (128 by default); a larger batch drops the rest (link-limit.ts).
const linkShortfall = tracing ? producerLinkShortfall(process.env, config.batchSize) : null;
if (linkShortfall !== null) log.warn({ ...linkShortfall }, linkShortfallLine(linkShortfall));
if (config.messageMapping !== null) log.info({ mapping: config.messageMapping.declared }, 'messages read through TALLY_MESSAGE_MAPPING');
const onBug = exitOnBug(log);
const daemon = new Daemon(config, log, { onBug, injectBug: faults.bug });

async function stopAll(): Promise<void> {
  await daemon.stop();
  await tracing?.shutdown().catch((error: unknown) => log.warn({ err: String(error) }, 'flushing traces failed'));
}

let signalled = false;
function onSignal(signal: NodeJS.Signals): void {
  if (signalled) {
    // A second signal means "now": whatever is unacked is redelivered later.
    log.warn({ signal, pendingStep: daemon.pendingStopStep }, 'second signal: exiting without finishing in-flight work');
    process.exit(EXIT.forced);
  }
  signalled = true;
  log.info({ signal }, 'signal received');
  // Whatever Redis or RabbitMQ do, the process is gone by grace + margin.
  const limitMs = config.shutdownGraceMs + SHUTDOWN_MARGIN_MS;
  setTimeout(() => {
    log.fatal(
      { limitMs, pendingStep: daemon.pendingStopStep, status: daemon.status },
      'stop did not finish within the grace period plus margin; exiting, unacked work is redelivered',
    );
    process.exit(EXIT.forced);
  }, limitMs);
  stopAll().then(
    () => process.exit(EXIT.stopped),
    (error) => {
      log.error({ err: error instanceof Error ? error.message : String(error) }, 'stop failed');
      process.exit(EXIT.fatal);
    },
  );
}
process.on('SIGTERM', onSignal);
process.on('SIGINT', onSignal);
// Unacked work is redelivered, so dying loudly is safer than limping on: a
// bug exits 70 with its stack, anything else 1 (node's own default for an
// uncaught exception).
process.on('unhandledRejection', (reason) => {
  if (classifyError(reason) === 'bug') onBug(reason, 'unhandled rejection');
  log.fatal({ err: reason instanceof Error ? reason.stack : String(reason) }, 'unhandled rejection');
  process.exit(EXIT.fatal);
});
process.on('uncaughtException', (error) => {
  if (classifyError(error) === 'bug') onBug(error, 'uncaught exception');
  log.fatal({ err: error.stack ?? String(error) }, 'uncaught exception');
  process.exit(EXIT.fatal);
});

try {
  await daemon.start();
} catch (error) {
  if (classifyError(error) === 'bug') onBug(error, 'start');
  const message = error instanceof Error ? error.message : String(error);
  log.fatal({ err: message, code: isTallyError(error) ? error.code : undefined }, 'start failed');
  await daemon.stop(0).catch(() => {});
  fail(EXIT.fatal, `start failed: ${message}`);
}
