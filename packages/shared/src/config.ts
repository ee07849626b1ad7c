/**
 * TALLY_* environment variables into one validated, frozen TallyConfig: the only reader of the environment
 * (a bad value is a ConfigError naming the variable and its accepted range), and the fault-injection switches.
 */
import { isIP } from 'node:net';
import { availableParallelism } from 'node:os';
import { validateAmqpNodes } from './broker-nodes.js';
import { closestName } from './closest-name.js';
import { ConfigError } from './errors.js';
import type { MarkerScope } from './markers.js';
import { parseMessageMapping, type MessageMapping } from './message-mapping.js';
import { isSentinelUrl, parseSentinelUrl } from './sentinel-url.js';

export type TallyMode = 'two-step' | 'atomic';

/** Modes this build can run; see docs/atomic-mode.md for when to pick which. */
export const SUPPORTED_MODES: readonly TallyMode[] = Object.freeze(['two-step', 'atomic']);

/**
 * Where messages come from (TALLY_SOURCE). `queue`: a queue that delivers at
 * least once, deduplicated by markers (TALLY_MODE). `stream`: RabbitMQ
 * streams, a log whose offsets make every replay recognisable, applied
 * exactly once by watermarks with no marker (docs/streams.md).
 */
export type TallySource = 'queue' | 'stream';
export const SOURCES: readonly TallySource[] = Object.freeze(['queue', 'stream']);

/** The type of the queues Tally declares; an existing queue is used as it is. See docs/scale-out.md. */
export type QueueType = 'classic' | 'quorum';
export const QUEUE_TYPES: readonly QueueType[] = Object.freeze(['classic', 'quorum']);
export const MARKER_SCOPES: readonly MarkerScope[] = Object.freeze(['part', 'message']);

export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
const LOG_LEVELS: readonly LogLevel[] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export interface TallyConfig {
  /**
   * TALLY_AMQP_URL as given (schemes lower-cased): one URL, or the nodes of
   * one RabbitMQ cluster separated by commas. Log it only through redactUrl.
   */
  readonly amqpUrl: string;
  /** The URLs of TALLY_AMQP_URL, one per node, in the order given: the daemon and the CLI try them in turn (broker-nodes.ts). */
  readonly amqpNodes: readonly string[];
  /**
   * TALLY_REDIS_URL as given (scheme lower-cased): one URL, the seed nodes
   * of a Redis Cluster separated by commas, or Sentinels and a master name
   * (redis+sentinel://, sentinel-url.ts). Log it only through redactUrl.
   */
  readonly redisUrl: string;
  /** The URLs of TALLY_REDIS_URL, one per seed node (one for a standalone Redis). */
  readonly redisSeeds: readonly string[];
  readonly queue: string;
  /** `<queue>.dead`: where bad messages go, with `x-tally-reason`. */
  readonly deadLetterQueue: string;
  /** Applies to the queues Tally declares (x-queue-type). */
  readonly queueType: QueueType;
  /** Quorum queues only: deliveries of one message before the broker dead-letters it to `<queue>.dead` (x-delivery-limit). */
  readonly deliveryLimit: number;
  /**
   * TALLY_PARTITIONS: 1 (one queue, TALLY_QUEUE) or N > 1 queues
   * `<queue>.0` … `<queue>.<N-1>` behind a consistent-hash exchange named
   * TALLY_QUEUE, each with single active consumer (partitions.ts).
   */
  readonly partitions: number;
  /** How often a daemon refreshes its heartbeat and mode lease; both expire after 3 intervals. */
  readonly heartbeatMs: number;
  readonly prefix: string;
  /** TALLY_SOURCE. */
  readonly source: TallySource;
  /** Queue source: how markers are written. A stream source has no markers: the mode does not apply (and TALLY_MODE is refused). */
  readonly mode: TallyMode;
  /**
   * Stream source: TALLY_STREAM_DEDUP. On: a producer's duplicate (the same
   * id published again, at a later offset) is skipped when it comes within
   * TALLY_MARKER_TTL_S of the first, by an id window in the daemon's memory
   * (id-window.ts). Off: every offset counts (producers that never retry).
   */
  readonly streamDedup: boolean;
  /** Stream source: TALLY_STREAM_CHECKPOINT_MS, how often a partition's committed offset is written to Redis. */
  readonly checkpointMs: number;
  readonly workers: number;
  readonly prefetch: number;
  readonly batchSize: number;
  /** TALLY_BATCH_MAX_CHANGES: a shard batch's changes, summed over its parts, stay within this (one part at least). */
  readonly batchMaxChanges: number;
  readonly batchWaitMs: number;
  readonly markerTtlS: number;
  /**
   * TALLY_MARKER_SUB_BUCKETS: marker hashes of a shard's time bucket when the
   * bucket before it is unknown (a power of two); later buckets size
   * themselves from the one before (markers.ts). Recorded when a prefix is
   * first laid out.
   */
  readonly markerSubBuckets: number;
  /** TALLY_MARKER_CLAIM_TTL_S: a two-step claim older than this is taken over (its daemon died or stalled); longer than any batch. */
  readonly markerClaimTtlS: number;
  /**
   * TALLY_MARKER_NATIVE_CLAIMS: two-step claims of new parts by native
   * commands where that is safe (worker/src/native-claims.ts). It trades
   * daemon CPU for Redis CPU (about 17 µs more of the one for 4 µs less of
   * the other per message, docs/benchmark.md), so it is off unless one
   * Redis is what limits the fleet.
   */
  readonly markerNativeClaims: boolean;
  /**
   * TALLY_MARKER_SCOPE: what one marker stands for (markers.ts MarkerScope),
   * for a prefix laid out from now on; a prefix keeps the scope it was laid
   * out with. `message` needs a standalone Redis. null when not set: the
   * daemon picks by topology once it has probed Redis (defaultMarkerScope).
   */
  readonly markerScope: MarkerScope | null;
  readonly countTtlS: number;
  /**
   * TALLY_MESSAGE_MAPPING: where a message in the user's own shape keeps its
   * id, changes, SKU, delta and type (message-mapping.ts). null: the
   * contract's shape, read by its JSON.parse-free fast path.
   */
  readonly messageMapping: MessageMapping | null;
  /** null accepts every change type. */
  readonly acceptTypes: ReadonlySet<string> | null;
  /** null: no metrics endpoint. */
  readonly metricsPort: number | null;
  /** The address the metrics/health endpoint binds to; loopback unless an operator opens it. */
  readonly metricsHost: string;
  readonly virtualShards: number;
  readonly maxMessageBytes: number;
  readonly shutdownGraceMs: number;
  /**
   * TALLY_STALL_MS: once the oldest unacked delivery has been unfinished this
   * long, the finished ones behind it are acked one by one instead of waiting
   * for it, and /readyz reports the stall. Keep it well below the broker's
   * consumer_timeout and the marker TTL (docs/faults-and-deviation.md).
   */
  readonly stallMs: number;
  readonly logLevel: LogLevel;
  /**
   * TALLY_ALLOW_EVICTION: start even when Redis's maxmemory-policy may evict
   * keys. Every Tally key has a TTL, so any volatile-* or allkeys-* policy can
   * drop counts (lost) or markers (counted twice); off by default.
   */
  readonly allowEviction: boolean;
  /** TALLY_REDIS_WAIT_REPLICAS: replicas that must acknowledge a batch's writes (Redis WAIT) before its deliveries are acked; 0 = no WAIT. */
  readonly redisWaitReplicas: number;
  /** TALLY_REDIS_WAIT_TIMEOUT_MS: how long one WAIT may block; a timeout is retried, never acked. */
  readonly redisWaitTimeoutMs: number;
}

/** Frozen defaults, the single place where a default value is written down. */
export const DEFAULTS = Object.freeze({
  amqpUrl: 'amqp://guest:guest@127.0.0.1:5672',
  redisUrl: 'redis://127.0.0.1:6379',
  queue: 'inventory.changes',
  prefix: 'tally:',
  source: 'queue' as TallySource,
  mode: 'two-step' as TallyMode,
  streamDedup: true,
  checkpointMs: 1_000,
  queueType: 'classic' as QueueType,
  deliveryLimit: 20,
  heartbeatMs: 5_000,
  partitions: 1,
  prefetch: 2000,
  batchSize: 500,
  // A stream source's defaults: a redelivery costs a stream nothing but a re-read the watermarks skip, and its
  // throughput is bounded by what is in flight (bench/results: 16,000 and 2,000 drained a stream 1.3x faster
  // than 2,000 and 500, with a quarter less Redis CPU per message from the larger sums).
  streamPrefetch: 16_000,
  streamBatchSize: 2_000,
  // Measured (docs/redis-requirements.md, "Bounded batches"): with every
  // change aimed at one shard, the longest script went from 218 ms (two-step)
  // and 712 ms (atomic) without a change limit to 25 ms and 104 ms with this
  // one. Ordinary batches (about one change per part) never reach it.
  batchMaxChanges: 5_000,
  batchWaitMs: 50,
  markerTtlS: 600,
  markerSubBuckets: 256,
  markerClaimTtlS: 10,
  markerNativeClaims: false,
  markerScope: null as MarkerScope | null,
  countTtlS: 2_592_000,
  virtualShards: 16,
  maxMessageBytes: 65_536,
  shutdownGraceMs: 30_000,
  stallMs: 30_000,
  logLevel: 'info' as LogLevel,
  metricsHost: '127.0.0.1',
  allowEviction: false,
  redisWaitReplicas: 0,
  redisWaitTimeoutMs: 5_000,
});

/** Ranges, named so the error message can quote them. */
export const LIMITS = Object.freeze({
  workers: [1, 64],
  prefetch: [1, 65_535],
  batchSize: [1, 100_000],
  batchMaxChanges: [1, 10_000_000],
  batchWaitMs: [0, 60_000],
  markerTtlS: [1, 31_536_000],
  markerSubBuckets: [1, 65_536],
  markerClaimTtlS: [1, 3_600],
  countTtlS: [1, 315_360_000],
  metricsPort: [0, 65_535],
  virtualShards: [1, 1024],
  maxMessageBytes: [64, 16_777_216],
  shutdownGraceMs: [0, 600_000],
  stallMs: [100, 3_600_000],
  redisWaitReplicas: [0, 16],
  // WAIT 0 blocks forever: a stalled ack nobody sees. One minute is already
  // longer than any replica that is keeping up needs.
  redisWaitTimeoutMs: [1, 60_000],
  deliveryLimit: [1, 1_000],
  heartbeatMs: [100, 60_000],
  checkpointMs: [10, 600_000],
  // One channel per partition a daemon holds; RabbitMQ's default channel_max is 2047 per connection.
  partitions: [1, 1024],
} as const);

export type Env = Readonly<Record<string, string | undefined>>;

/**
 * Every TALLY_* variable Tally reads: the settings of loadConfig, then the
 * fault injection of loadFaultInjection (test/config.test.ts checks that
 * both read exactly these). Any other TALLY_* variable in the environment
 * stops the start (unknownSettingError): a misspelled TALLY_MODEE=atomic
 * would otherwise run a two-step daemon that its operator believes atomic.
 * The standard OTEL_* variables are read by the OpenTelemetry SDK, not here.
 */
export const TALLY_SETTINGS: readonly string[] = Object.freeze([
  'TALLY_AMQP_URL',
  'TALLY_REDIS_URL',
  'TALLY_QUEUE',
  'TALLY_QUEUE_TYPE',
  'TALLY_DELIVERY_LIMIT',
  'TALLY_HEARTBEAT_MS',
  'TALLY_PARTITIONS',
  'TALLY_PREFIX',
  'TALLY_SOURCE',
  'TALLY_MODE',
  'TALLY_STREAM_DEDUP',
  'TALLY_STREAM_CHECKPOINT_MS',
  'TALLY_VIRTUAL_SHARDS',
  'TALLY_WORKERS',
  'TALLY_PREFETCH',
  'TALLY_BATCH_SIZE',
  'TALLY_BATCH_MAX_CHANGES',
  'TALLY_BATCH_WAIT_MS',
  'TALLY_MARKER_TTL_S',
  'TALLY_MARKER_SUB_BUCKETS',
  'TALLY_MARKER_CLAIM_TTL_S',
  'TALLY_MARKER_NATIVE_CLAIMS',
  'TALLY_MARKER_SCOPE',
  'TALLY_COUNT_TTL_S',
  'TALLY_MESSAGE_MAPPING',
  'TALLY_ACCEPT_TYPES',
  'TALLY_METRICS_PORT',
  'TALLY_METRICS_HOST',
  'TALLY_MAX_MESSAGE_BYTES',
  'TALLY_SHUTDOWN_GRACE_MS',
  'TALLY_STALL_MS',
  'TALLY_LOG_LEVEL',
  'TALLY_ALLOW_EVICTION',
  'TALLY_REDIS_WAIT_REPLICAS',
  'TALLY_REDIS_WAIT_TIMEOUT_MS',
  // loadFaultInjection: the fault suite's, never for production (docs/faults-and-deviation.md).
  'TALLY_FAULT_THREAD_EXIT_AFTER_WRITE',
  'TALLY_FAULT_KILL_AFTER_WRITE',
  'TALLY_FAULT_BUG',
  'TALLY_FAULT_STREAM_OVERLAP',
]);

const SETTING_PREFIX = 'TALLY_';

/** The message is the clause itself, so the line reads "TALLY_MODEE is not a Tally setting; did you mean TALLY_MODE?". */
class UnknownSettingError extends ConfigError {
  constructor(variable: string, message: string) {
    super(variable, message);
    this.message = message;
  }
}

/** One clause of the refusal: the unknown name and the setting nearest to it. */
function unknownSettingClause(name: string): string {
  // Compared without the shared prefix, so that its six letters do not make every name look close.
  const nearest = closestName(
    name.slice(SETTING_PREFIX.length),
    TALLY_SETTINGS.map((setting) => setting.slice(SETTING_PREFIX.length)),
  );
  if (nearest === null) return `${name} is not a Tally setting`;
  const setting = `${SETTING_PREFIX}${nearest.name}`;
  return nearest.close
    ? `${name} is not a Tally setting; did you mean ${setting}?`
    : `${name} is not a Tally setting (none is close; the nearest is ${setting})`;
}

/**
 * A ConfigError naming every TALLY_* variable of `env` that is not in
 * TALLY_SETTINGS, each with the setting nearest to it; null when there is
 * none. Only the exact upper-case prefix is Tally's: `tally_mode` is left
 * alone like any other variable outside TALLY_*.
 */
export function unknownSettingError(env: Env): ConfigError | null {
  const unknown = Object.keys(env)
    .filter((name) => name.startsWith(SETTING_PREFIX) && env[name] !== undefined && !TALLY_SETTINGS.includes(name))
    .sort();
  if (unknown.length === 0) return null;
  return new UnknownSettingError(unknown[0]!, unknown.map(unknownSettingClause).join(' '));
}

function read(env: Env, name: string): string | undefined {
  const value = env[name];
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  return trimmed === '' ? undefined : trimmed;
}

function integer(env: Env, name: string, fallback: number, [min, max]: readonly [number, number]): number {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  if (!/^-?\d+$/.test(raw)) {
    throw new ConfigError(name, `expected an integer from ${min} to ${max}, got ${JSON.stringify(raw)}`);
  }
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new ConfigError(name, `expected an integer from ${min} to ${max}, got ${raw}`);
  }
  return value;
}

function powerOfTwo(env: Env, name: string, fallback: number, range: readonly [number, number]): number {
  const value = integer(env, name, fallback, range);
  if ((value & (value - 1)) !== 0) throw new ConfigError(name, `expected a power of two from ${range[0]} to ${range[1]}, got ${value}`);
  return value;
}

/**
 * URL schemes are case-insensitive (RFC 3986), and `new URL` accepts
 * `REDISS://`, but ioredis tests `startsWith('rediss://')`: an upper-case
 * scheme connected in plaintext and sent the password in the clear. Every
 * consumer (daemon, worker threads, CLI) takes the URL from here, so the
 * scheme is lowered once; the rest of the URL is left exactly as given.
 */
function withLowerCaseScheme(raw: string): string {
  return raw.replace(/^[A-Za-z][A-Za-z0-9+.-]*:/, (scheme) => scheme.toLowerCase());
}

/**
 * Splits a TALLY_REDIS_URL list into its URLs. A comma starts a new URL only
 * when a `redis://` or `rediss://` scheme follows it, so a comma inside a
 * password (allowed unencoded in userinfo) does not split it.
 */
export function splitRedisUrls(raw: string): string[] {
  return raw
    .split(/,\s*(?=rediss?:\/\/)/i)
    .map((part) => part.trim())
    .filter((part) => part !== '');
}

/**
 * TALLY_REDIS_URL: one URL, or several comma-separated seed nodes of one
 * Redis Cluster. The client carries the first seed's credentials and TLS to
 * every node the cluster announces (one user for the whole cluster), so the
 * seeds must agree on the scheme and on any credentials they repeat. A
 * cluster has database 0 only, so a list cannot name another one. Errors
 * name the seed by position, never by its text: it may hold a password.
 */
function redisUrls(env: Env, name: string, fallback: string): { redisUrl: string; redisSeeds: readonly string[] } {
  const raw = read(env, name) ?? fallback;
  if (isSentinelUrl(raw)) {
    // Sentinels and a master name (sentinel-url.ts): validated here, parsed again where a client is built.
    parseSentinelUrl(raw, name);
    const url = withLowerCaseScheme(raw.trim());
    return { redisUrl: url, redisSeeds: Object.freeze([url]) };
  }
  const seeds = splitRedisUrls(raw);
  if (seeds.length === 0) throw new ConfigError(name, 'expected a redis:// or rediss:// URL, or several comma-separated');
  const parsed: URL[] = [];
  seeds.forEach((seed, i) => {
    const where = seeds.length === 1 ? '' : ` (seed ${i + 1} of ${seeds.length})`;
    let url: URL;
    try {
      url = new URL(seed);
    } catch {
      // The raw value may hold a password: never echo it back.
      throw new ConfigError(name, `not a valid URL${where}; expected redis://… or rediss://…, comma-separated for several cluster seed nodes`);
    }
    if (url.protocol !== 'redis:' && url.protocol !== 'rediss:') {
      throw new ConfigError(
        name,
        `unsupported scheme ${JSON.stringify(url.protocol)}${where}; expected one of redis:, rediss:, redis+sentinel:, rediss+sentinel:`,
      );
    }
    if (url.hostname === '') throw new ConfigError(name, `no host${where}`);
    parsed.push(url);
  });
  if (seeds.length > 1) {
    const first = parsed[0]!;
    parsed.forEach((url, i) => {
      const where = `seed ${i + 1} of ${seeds.length}`;
      if (url.protocol !== first.protocol) {
        throw new ConfigError(name, `${where} uses ${url.protocol}// but seed 1 uses ${first.protocol}//; every node of a cluster is reached the same way`);
      }
      if ((url.username !== '' || url.password !== '') && (url.username !== first.username || url.password !== first.password)) {
        throw new ConfigError(
          name,
          `${where} names other credentials than seed 1; a cluster is reached with one user: put it on seed 1 (or repeat it exactly)`,
        );
      }
      if (!/^\/?0?$/.test(url.pathname)) {
        throw new ConfigError(name, `${where} names database ${JSON.stringify(url.pathname.slice(1))}; a Redis Cluster has database 0 only`);
      }
    });
  }
  const normalized = seeds.map(withLowerCaseScheme);
  return { redisUrl: normalized.join(','), redisSeeds: Object.freeze(normalized) };
}

/** TALLY_AMQP_URL: one URL or the nodes of one cluster; the rules are in broker-nodes.ts. */
function amqpUrls(env: Env, name: string, fallback: string): { amqpUrl: string; amqpNodes: readonly string[] } {
  const nodes = validateAmqpNodes(name, read(env, name) ?? fallback, withLowerCaseScheme);
  return { amqpUrl: nodes.join(','), amqpNodes: Object.freeze(nodes) };
}

const TRUE_WORDS = ['1', 'true', 'yes'];
const FALSE_WORDS = ['0', 'false', 'no'];

function flag(env: Env, name: string, fallback: boolean): boolean {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  const word = raw.toLowerCase();
  if (TRUE_WORDS.includes(word)) return true;
  if (FALSE_WORDS.includes(word)) return false;
  throw new ConfigError(name, `expected one of ${[...TRUE_WORDS, ...FALSE_WORDS].join(', ')}, got ${JSON.stringify(raw)}`);
}

/** Queue names: AMQP allows up to 255 bytes; `.dead` is appended. */
function queueName(env: Env, name: string, fallback: string): string {
  const raw = read(env, name) ?? fallback;
  if (Buffer.byteLength(raw) > 250 || raw.startsWith('amq.')) {
    throw new ConfigError(name, `expected a queue name of at most 250 bytes not starting with "amq.", got ${JSON.stringify(raw)}`);
  }
  return raw;
}

/**
 * The prefix is spliced into every key and into SCAN patterns. Braces would
 * move the Redis Cluster hash tag and glob characters would widen a SCAN, so
 * only a plain alphabet is accepted.
 */
function prefix(env: Env, name: string, fallback: string): string {
  const raw = env[name] === undefined ? fallback : (env[name] as string);
  if (!/^[A-Za-z0-9_.:-]{1,64}$/.test(raw)) {
    throw new ConfigError(name, `expected 1 to 64 characters from [A-Za-z0-9_.:-], got ${JSON.stringify(raw)}`);
  }
  return raw;
}

function mode(env: Env, name: string): TallyMode {
  const raw = read(env, name) ?? DEFAULTS.mode;
  if (!(SUPPORTED_MODES as readonly string[]).includes(raw)) {
    throw new ConfigError(name, `expected one of ${SUPPORTED_MODES.join(', ')}, got ${JSON.stringify(raw)}`);
  }
  return raw as TallyMode;
}

function source(env: Env, name: string): TallySource {
  const raw = read(env, name) ?? DEFAULTS.source;
  if (!(SOURCES as readonly string[]).includes(raw)) {
    throw new ConfigError(name, `expected one of ${SOURCES.join(', ')}, got ${JSON.stringify(raw)}`);
  }
  return raw as TallySource;
}

function markerScope(env: Env, name: string): MarkerScope | null {
  const raw = read(env, name);
  if (raw === undefined) return DEFAULTS.markerScope;
  if (!(MARKER_SCOPES as readonly string[]).includes(raw)) {
    throw new ConfigError(name, `expected one of ${MARKER_SCOPES.join(', ')}, got ${JSON.stringify(raw)}`);
  }
  return raw as MarkerScope;
}

function queueType(env: Env, name: string): QueueType {
  const raw = read(env, name) ?? DEFAULTS.queueType;
  if (!(QUEUE_TYPES as readonly string[]).includes(raw)) {
    throw new ConfigError(name, `expected one of ${QUEUE_TYPES.join(', ')}, got ${JSON.stringify(raw)}`);
  }
  return raw as QueueType;
}

function acceptTypes(env: Env, name: string): ReadonlySet<string> | null {
  const raw = read(env, name);
  if (raw === undefined) return null;
  const types = raw
    .split(',')
    .map((t) => t.trim())
    .filter((t) => t !== '');
  if (types.length === 0) return null;
  for (const t of types) {
    if (t.length > 64) throw new ConfigError(name, `type names are at most 64 characters, got ${JSON.stringify(t)}`);
  }
  return new Set(types);
}

/**
 * TALLY_MESSAGE_MAPPING: one JSON object, so that the whole declaration is
 * one value (set together, refused together) and a JSON Pointer may hold any
 * character (a comma, a space) without a quoting rule of Tally's own. In a
 * systemd EnvironmentFile it goes inside single quotes, which keep its
 * double quotes as they are (docs/operations.md).
 */
function messageMapping(env: Env, name: string): MessageMapping | null {
  const raw = read(env, name);
  return raw === undefined ? null : parseMessageMapping(name, raw);
}

/**
 * An IP literal (v4 or v6, `::` for every interface) or a host name. Bound by
 * node:http as given; a name that does not resolve fails the start there.
 */
function host(env: Env, name: string, fallback: string): string {
  const raw = read(env, name) ?? fallback;
  if (isIP(raw) === 0 && !/^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/.test(raw)) {
    throw new ConfigError(name, `expected an IP address (127.0.0.1, 0.0.0.0, ::) or a host name, got ${JSON.stringify(raw)}`);
  }
  return raw;
}

function logLevel(env: Env, name: string): LogLevel {
  const raw = read(env, name) ?? DEFAULTS.logLevel;
  if (!(LOG_LEVELS as readonly string[]).includes(raw)) {
    throw new ConfigError(name, `expected one of ${LOG_LEVELS.join(', ')}, got ${JSON.stringify(raw)}`);
  }
  return raw as LogLevel;
}

/**
 * Turns the environment into a validated, frozen config. This is the only
 * function that reads TALLY_* variables (with loadFaultInjection); everything
 * else takes TallyConfig. A TALLY_* variable that is not a setting
 * (TALLY_SETTINGS) stops it: the daemon and the CLI both start here.
 */
export function loadConfig(env: Env = process.env): TallyConfig {
  // First, so that a misspelled setting is named as such rather than its default taken silently.
  const unknown = unknownSettingError(env);
  if (unknown !== null) throw unknown;
  const virtualShards = integer(env, 'TALLY_VIRTUAL_SHARDS', DEFAULTS.virtualShards, LIMITS.virtualShards);
  // One core is left to the main thread, which parses, shards and acks every
  // delivery: more worker threads than the cores beside it only compete with
  // it for CPU and add cross-thread handoffs (the workers sweep in
  // docs/benchmark.md).
  const defaultWorkers = Math.min(Math.max(1, availableParallelism() - 1), virtualShards);
  const workers = integer(env, 'TALLY_WORKERS', defaultWorkers, LIMITS.workers);
  if (workers > virtualShards) {
    throw new ConfigError(
      'TALLY_WORKERS',
      `must not exceed TALLY_VIRTUAL_SHARDS (${virtualShards}): each thread owns at least one virtual shard, got ${workers}`,
    );
  }
  const queue = queueName(env, 'TALLY_QUEUE', DEFAULTS.queue);
  const metricsPortRaw = read(env, 'TALLY_METRICS_PORT');
  const from = source(env, 'TALLY_SOURCE');
  // A stream is applied exactly once by construction: a mode asked for would be a promise of something else.
  if (from === 'stream' && read(env, 'TALLY_MODE') !== undefined) {
    throw new ConfigError(
      'TALLY_MODE',
      `does not apply with TALLY_SOURCE=stream, which is exact by construction (watermarks, no markers); unset TALLY_MODE, got ${JSON.stringify(read(env, 'TALLY_MODE'))}`,
    );
  }
  return Object.freeze({
    ...amqpUrls(env, 'TALLY_AMQP_URL', DEFAULTS.amqpUrl),
    ...redisUrls(env, 'TALLY_REDIS_URL', DEFAULTS.redisUrl),
    queue,
    deadLetterQueue: `${queue}.dead`,
    queueType: queueType(env, 'TALLY_QUEUE_TYPE'),
    deliveryLimit: integer(env, 'TALLY_DELIVERY_LIMIT', DEFAULTS.deliveryLimit, LIMITS.deliveryLimit),
    heartbeatMs: integer(env, 'TALLY_HEARTBEAT_MS', DEFAULTS.heartbeatMs, LIMITS.heartbeatMs),
    partitions: integer(env, 'TALLY_PARTITIONS', DEFAULTS.partitions, LIMITS.partitions),
    prefix: prefix(env, 'TALLY_PREFIX', DEFAULTS.prefix),
    source: from,
    mode: mode(env, 'TALLY_MODE'),
    streamDedup: flag(env, 'TALLY_STREAM_DEDUP', DEFAULTS.streamDedup),
    checkpointMs: integer(env, 'TALLY_STREAM_CHECKPOINT_MS', DEFAULTS.checkpointMs, LIMITS.checkpointMs),
    workers,
    prefetch: integer(env, 'TALLY_PREFETCH', from === 'stream' ? DEFAULTS.streamPrefetch : DEFAULTS.prefetch, LIMITS.prefetch),
    batchSize: integer(env, 'TALLY_BATCH_SIZE', from === 'stream' ? DEFAULTS.streamBatchSize : DEFAULTS.batchSize, LIMITS.batchSize),
    batchMaxChanges: integer(env, 'TALLY_BATCH_MAX_CHANGES', DEFAULTS.batchMaxChanges, LIMITS.batchMaxChanges),
    batchWaitMs: integer(env, 'TALLY_BATCH_WAIT_MS', DEFAULTS.batchWaitMs, LIMITS.batchWaitMs),
    markerTtlS: integer(env, 'TALLY_MARKER_TTL_S', DEFAULTS.markerTtlS, LIMITS.markerTtlS),
    markerSubBuckets: powerOfTwo(env, 'TALLY_MARKER_SUB_BUCKETS', DEFAULTS.markerSubBuckets, LIMITS.markerSubBuckets),
    markerClaimTtlS: integer(env, 'TALLY_MARKER_CLAIM_TTL_S', DEFAULTS.markerClaimTtlS, LIMITS.markerClaimTtlS),
    markerNativeClaims: flag(env, 'TALLY_MARKER_NATIVE_CLAIMS', DEFAULTS.markerNativeClaims),
    markerScope: markerScope(env, 'TALLY_MARKER_SCOPE'),
    countTtlS: integer(env, 'TALLY_COUNT_TTL_S', DEFAULTS.countTtlS, LIMITS.countTtlS),
    messageMapping: messageMapping(env, 'TALLY_MESSAGE_MAPPING'),
    acceptTypes: acceptTypes(env, 'TALLY_ACCEPT_TYPES'),
    metricsPort: metricsPortRaw === undefined ? null : integer(env, 'TALLY_METRICS_PORT', 0, LIMITS.metricsPort),
    metricsHost: host(env, 'TALLY_METRICS_HOST', DEFAULTS.metricsHost),
    virtualShards,
    maxMessageBytes: integer(env, 'TALLY_MAX_MESSAGE_BYTES', DEFAULTS.maxMessageBytes, LIMITS.maxMessageBytes),
    shutdownGraceMs: integer(env, 'TALLY_SHUTDOWN_GRACE_MS', DEFAULTS.shutdownGraceMs, LIMITS.shutdownGraceMs),
    stallMs: integer(env, 'TALLY_STALL_MS', DEFAULTS.stallMs, LIMITS.stallMs),
    logLevel: logLevel(env, 'TALLY_LOG_LEVEL'),
    allowEviction: flag(env, 'TALLY_ALLOW_EVICTION', DEFAULTS.allowEviction),
    redisWaitReplicas: integer(env, 'TALLY_REDIS_WAIT_REPLICAS', DEFAULTS.redisWaitReplicas, LIMITS.redisWaitReplicas),
    redisWaitTimeoutMs: integer(env, 'TALLY_REDIS_WAIT_TIMEOUT_MS', DEFAULTS.redisWaitTimeoutMs, LIMITS.redisWaitTimeoutMs),
  });
}

/**
 * Fault injection for the fault suite (docs/faults-and-deviation.md), never
 * for production. Read by the worker thread only, through this function, so
 * the variable is still read and validated in this file.
 */
export interface FaultInjection {
  /**
   * TALLY_FAULT_THREAD_EXIT_AFTER_WRITE=<n>: a worker thread ends itself
   * (process.exit inside the thread: a real thread death, which piscina
   * reports as "worker exited" and replaces) right after its n-th count write
   * that wrote something, before the markers are occupied (two-step) or
   * before the reply is sent (atomic). A rerun answered by its receipt does
   * not count, so a rerun always gets through. null: off.
   */
  readonly threadExitAfterWrite: number | null;
  /**
   * TALLY_FAULT_KILL_AFTER_WRITE=<n>: the daemon SIGKILLs its own process
   * right after a worker thread's n-th count write that wrote something,
   * before the markers are occupied: a crash in the two-step window, on
   * purpose (fenced adoption must leave nothing counted twice). null: off.
   */
  readonly killAfterWrite: number | null;
  /**
   * TALLY_FAULT_BUG=thread|main: a programming error of Tally's own, for the
   * test of invariant 13 (a bug is not an outage). `thread`: every batch a
   * worker thread runs throws a TypeError before it writes anything. `main`:
   * every delivery makes the coordinator's ack tracker throw its RangeError
   * (a delivery tag out of sequence) in the consumer callback. Either way the
   * daemon must log the stack once, ack nothing and exit 70. null: off.
   */
  readonly bug: InjectedBug | null;
  /**
   * TALLY_FAULT_STREAM_OVERLAP=1: a stream daemon consumes every partition,
   * whatever the balancer assigns it, so two daemons read one partition at
   * once on purpose (the handoff overlap, held open): the watermarks must
   * keep the counts exact. false: off.
   */
  readonly streamOverlap: boolean;
}

export const INJECTED_BUGS = Object.freeze(['thread', 'main'] as const);
export type InjectedBug = (typeof INJECTED_BUGS)[number];

export function loadFaultInjection(env: Env = process.env): FaultInjection {
  const raw = read(env, 'TALLY_FAULT_THREAD_EXIT_AFTER_WRITE');
  const kill = read(env, 'TALLY_FAULT_KILL_AFTER_WRITE');
  const bug = read(env, 'TALLY_FAULT_BUG');
  if (bug !== undefined && !(INJECTED_BUGS as readonly string[]).includes(bug)) {
    throw new ConfigError('TALLY_FAULT_BUG', `expected one of ${INJECTED_BUGS.join(', ')}, got ${JSON.stringify(bug)}`);
  }
  return Object.freeze({
    threadExitAfterWrite: raw === undefined ? null : integer(env, 'TALLY_FAULT_THREAD_EXIT_AFTER_WRITE', 0, [1, 1_000_000_000]),
    killAfterWrite: kill === undefined ? null : integer(env, 'TALLY_FAULT_KILL_AFTER_WRITE', 0, [1, 1_000_000_000]),
    bug: (bug ?? null) as InjectedBug | null,
    streamOverlap: flag(env, 'TALLY_FAULT_STREAM_OVERLAP', false),
  });
}
