#!/usr/bin/env node
/**
 * The daemon's entry point: the one place that reads the environment and
 * handles signals. Exit codes: 0 clean stop, 1 fatal runtime or start error,
 * 2 configuration error (with a one-line reason naming the variable).
 */
import { isTallyError, loadConfig, type TallyConfig } from '@tally/shared';
import { startTracing } from '@tally/runtime';
import { Daemon } from './daemon.js';
import { createLogger } from './logger.js';

function fail(code: number, line: string): never {
  process.stderr.write(`tally: ${line}\n`);
  process.exit(code);
}

let config: TallyConfig;
try {
  config = loadConfig(process.env);
} catch (error) {
  fail(2, `configuration error: ${error instanceof Error ? error.message : String(error)}`);
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
const daemon = new Daemon(config, log);

async function stopAll(): Promise<void> {
  await daemon.stop();
  await tracing?.shutdown().catch((error: unknown) => log.warn({ err: String(error) }, 'flushing traces failed'));
}

let signalled = false;
function onSignal(signal: NodeJS.Signals): void {
  if (signalled) {
    // A second signal means "now": whatever is unacked is redelivered later.
    log.warn({ signal }, 'second signal: exiting without finishing in-flight work');
    process.exit(1);
  }
  signalled = true;
  log.info({ signal }, 'signal received');
  stopAll().then(
    () => process.exit(0),
    (error) => {
      log.error({ err: error instanceof Error ? error.message : String(error) }, 'stop failed');
      process.exit(1);
    },
  );
}
process.on('SIGTERM', onSignal);
process.on('SIGINT', onSignal);
process.on('unhandledRejection', (reason) => {
  // Unacked work is redelivered, so dying loudly is safer than limping on.
  log.fatal({ err: reason instanceof Error ? reason.stack : String(reason) }, 'unhandled rejection');
  process.exit(1);
});

try {
  await daemon.start();
} catch (error) {
  const message = error instanceof Error ? error.message : String(error);
  log.fatal({ err: message, code: isTallyError(error) ? error.code : undefined }, 'start failed');
  await daemon.stop(0).catch(() => {});
  fail(1, `start failed: ${message}`);
}
