/**
 * The daemon's logger: pino JSON lines with trace ids and redaction.
 */
import { pino, type Logger } from 'pino';
import type { LogLevel } from '@tally/shared';
import { traceIdsOfActiveSpan } from '@tally/runtime';

export type { Logger };

/**
 * JSON lines on stdout. Credentials never reach a record: URLs are redacted
 * before they are logged (redactUrl), and these paths are censored in case a
 * config object or an error carrying one is logged whole.
 */
export function createLogger(level: LogLevel, bindings: Record<string, unknown> = {}): Logger {
  return pino({
    level,
    base: { service: 'tally', pid: process.pid, ...bindings },
    timestamp: pino.stdTimeFunctions.isoTime,
    // Every record made inside a span carries its trace id, so a log line
    // leads to its trace in Jaeger and back.
    mixin: traceIdsOfActiveSpan,
    redact: { paths: ['amqpUrl', 'redisUrl', 'config.amqpUrl', 'config.redisUrl', 'password', '*.password'], censor: '[redacted]' },
  });
}
