/**
 * Errors with a stable `code`. Callers and tests branch on the code, never on
 * the message text, so messages can be improved without breaking anyone.
 */
export type TallyErrorCode =
  | 'TALLY_CONFIG_INVALID'
  | 'TALLY_SHARD_LAYOUT_MISMATCH'
  | 'TALLY_MODE_MISMATCH'
  /** TALLY_PARTITIONS differs from the number of partitions recorded for the prefix. */
  | 'TALLY_PARTITIONS_MISMATCH'
  /** The prefix holds live markers in a format this build does not write (markers.ts). */
  | 'TALLY_MARKER_FORMAT'
  /** The CLI could not reach RabbitMQ (tally dead). */
  | 'TALLY_AMQP_UNAVAILABLE'
  /** RabbitMQ refused Tally at start (login, vhost, permission, queue arguments): the message names the fix. */
  | 'TALLY_AMQP_REFUSED'
  /** The broker's TLS certificate is not trusted, or does not name the host of TALLY_AMQP_URL (or amqps:// met a plaintext port): the message names the fix. */
  | 'TALLY_AMQP_TLS'
  | 'TALLY_CLI_USAGE'
  | 'TALLY_QUEUE_MISSING'
  | 'TALLY_REPLAY_REFUSED'
  /** A script or a worker thread replied with something Tally's code does not understand: a bug (failure class `bug`). */
  | 'TALLY_UNKNOWN_REPLY'
  | RedisRequirementCode;

/**
 * What a Redis can fail to give Tally at start (docs/redis-requirements.md).
 * Each is a configuration problem no retry fixes, so the start stops with
 * one line naming the fix instead of looping on "redis unavailable".
 */
export type RedisRequirementCode =
  | 'TALLY_REDIS_EVICTION_POLICY'
  | 'TALLY_REDIS_VERSION'
  | 'TALLY_REDIS_SCRIPTING'
  | 'TALLY_REDIS_NOPERM'
  | 'TALLY_REDIS_AUTH'
  | 'TALLY_REDIS_CLUSTER'
  | 'TALLY_REDIS_SENTINEL'
  | 'TALLY_REDIS_TLS';

export class TallyError extends Error {
  readonly code: TallyErrorCode;

  constructor(code: TallyErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** A configuration value is missing or out of range. Names the variable. */
export class ConfigError extends TallyError {
  readonly variable: string;

  constructor(variable: string, message: string) {
    super('TALLY_CONFIG_INVALID', `${variable}: ${message}`);
    this.variable = variable;
  }
}

/**
 * The Redis prefix was initialised with a different virtual-shard layout.
 * Starting anyway would move SKUs between shards and let a redelivery skip or
 * repeat parts (invariant 3), so the daemon refuses to start.
 */
export class ShardLayoutMismatchError extends TallyError {
  constructor(message: string) {
    super('TALLY_SHARD_LAYOUT_MISMATCH', message);
  }
}

/**
 * TALLY_MODE differs from the mode recorded for the prefix while markers are
 * live: daemons of the two modes would share them, and a message seen by
 * both could be counted twice, which atomic mode exists to rule out.
 */
export class ModeSwitchRefusedError extends TallyError {
  constructor(message: string) {
    super('TALLY_MODE_MISMATCH', message);
  }
}

/**
 * TALLY_PARTITIONS differs from the number recorded when the prefix was laid
 * out: daemons of the two numbers would compute different owners for the
 * partitions (one could be left unconsumed), and producers would be hashing
 * onto a ring the other daemons do not consume. Changing it is a procedure
 * (docs/operations.md), not a restart.
 */
export class PartitionCountMismatchError extends TallyError {
  constructor(message: string) {
    super('TALLY_PARTITIONS_MISMATCH', message);
  }
}

/**
 * The prefix's live markers are in another format than the one this build
 * writes: a daemon reading one format would miss duplicates recorded in the
 * other, so the start is refused until they expire (or on a new prefix).
 */
export class MarkerFormatRefusedError extends TallyError {
  constructor(message: string) {
    super('TALLY_MARKER_FORMAT', message);
  }
}

/** Redis does not meet a requirement (see RedisRequirementCode); the message names the fix. */
export class RedisRequirementError extends TallyError {
  declare readonly code: RedisRequirementCode;

  constructor(code: RedisRequirementCode, message: string) {
    super(code, message);
  }
}

export class CliUsageError extends TallyError {
  constructor(message: string) {
    super('TALLY_CLI_USAGE', message);
  }
}

/** A CLI command needs a queue the daemon has not declared yet (wrong TALLY_QUEUE, or never started). */
export class QueueMissingError extends TallyError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('TALLY_QUEUE_MISSING', message, options);
  }
}

/**
 * `tally dead replay` could not get a copy confirmed into the work queue
 * (nacked, or unroutable): the dead letter stays where it was, nothing moved.
 */
export class ReplayRefusedError extends TallyError {
  constructor(message: string) {
    super('TALLY_REPLAY_REFUSED', message);
  }
}

/**
 * A Lua script or a worker thread replied with a shape the code reading it
 * does not know (a field missing, a flag out of range). Not an outage and not
 * a refusal: the two sides of Tally disagree, which no retry fixes, so it is
 * classified `bug` (failure-class.ts) and stops the process (exit 70).
 */
export class UnknownReplyError extends TallyError {
  constructor(what: string, reply: unknown) {
    super('TALLY_UNKNOWN_REPLY', `${what} replied with an unknown shape: ${preview(reply)}`);
  }
}

/** At most 200 characters of a value, for an error message; never throws. */
function preview(value: unknown): string {
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = Object.prototype.toString.call(value);
  }
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

export function isTallyError(error: unknown): error is TallyError {
  return error instanceof TallyError;
}

/** An error's message for a log line; anything thrown that is not an Error is stringified. */
export function describeError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
