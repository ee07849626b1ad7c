/**
 * What Tally needs from Redis, decided from facts the start-up probe read
 * (packages/coordinator/src/redis/redis-probe.ts does the I/O). Pure, so every rule
 * is unit-tested with fake INFO text. docs/redis-requirements.md explains each
 * rule to operators; the codes are stable, the messages may improve.
 *
 * A fatal problem stops the start with its one-line message (exit 1). A
 * warning is logged and the daemon runs: the data is at risk but nothing is
 * wrong yet (replicas may come later, AOF may be switched on).
 */
import { RedisRequirementError, type RedisRequirementCode } from './errors.js';
import { CERTIFICATE_ERRORS, HOST_MISMATCH_ERROR } from './tls-trust.js';

/**
 * Redis 7.0: every Tally script starts with the `#!lua` shebang (script
 * flags, new in 7.0). Without flags Redis treats a script as one that may
 * write, so under OOM it is refused before it runs instead of failing after
 * its first write, which keeps a batch all-or-nothing. Redis 6.2 and older
 * do not know the shebang and refuse the script as a Lua syntax error.
 */
export const MIN_REDIS_VERSION = Object.freeze([7, 0, 0] as const);

export type RedisWarningCode = 'TALLY_REDIS_EVICTION_ALLOWED' | 'TALLY_REDIS_NOT_DURABLE' | 'TALLY_REDIS_FEW_REPLICAS' | 'TALLY_REDIS_UNKNOWN';

export interface RedisProblem {
  readonly code: RedisRequirementCode;
  readonly message: string;
}

export interface RedisWarning {
  readonly code: RedisWarningCode;
  readonly message: string;
}

/** A standalone Redis (one URL) or a Redis Cluster (cluster_enabled:1; one or more seed URLs). */
export type RedisTopology = 'standalone' | 'cluster';

/** What the probe learned; null where the server did not say. */
export interface RedisFacts {
  readonly version: string | null;
  /** From CONFIG GET when allowed, else INFO memory's maxmemory_policy. */
  readonly maxmemoryPolicy: string | null;
  readonly aofEnabled: boolean;
  readonly connectedReplicas: number;
  /** cluster_enabled:1. A cluster is detected before the facts are read (detectRedisTopology) and probed master by master. */
  readonly clusterEnabled: boolean;
  /** Still loading its data set: not an error, the probe waits. */
  readonly loading: boolean;
}

export interface RedisRequirementSettings {
  /** TALLY_ALLOW_EVICTION */
  readonly allowEviction: boolean;
  /** TALLY_REDIS_WAIT_REPLICAS */
  readonly waitReplicas: number;
}

export interface RedisAssessment {
  /** The first one stops the start; all are logged. */
  readonly fatal: readonly RedisProblem[];
  readonly warnings: readonly RedisWarning[];
}

/** The text of `INFO` or `CLUSTER INFO` (`field:value` lines, `# Section` headers) as a map. */
export function parseInfo(text: string): Map<string, string> {
  const fields = new Map<string, string>();
  for (const line of text.split(/\r?\n/)) {
    if (line === '' || line.startsWith('#')) continue;
    const colon = line.indexOf(':');
    if (colon > 0) fields.set(line.slice(0, colon), line.slice(colon + 1));
  }
  return fields;
}

export function factsFromInfo(info: string, configPolicy: string | null = null): RedisFacts {
  const fields = parseInfo(info);
  const replicas = Number(fields.get('connected_slaves') ?? '0');
  return {
    version: fields.get('redis_version') ?? null,
    maxmemoryPolicy: configPolicy ?? fields.get('maxmemory_policy') ?? null,
    aofEnabled: fields.get('aof_enabled') === '1',
    connectedReplicas: Number.isInteger(replicas) && replicas > 0 ? replicas : 0,
    clusterEnabled: fields.get('cluster_enabled') === '1',
    loading: fields.get('loading') === '1',
  };
}

/** Numeric parts of a version string ("7.0.15" -> [7, 0, 15]); null when it is not one. */
export function parseVersion(version: string): number[] | null {
  const match = /^(\d+)\.(\d+)(?:\.(\d+))?/.exec(version.trim());
  if (match === null) return null;
  return [Number(match[1]), Number(match[2]), Number(match[3] ?? 0)];
}

export function versionAtLeast(version: readonly number[], minimum: readonly number[]): boolean {
  for (let i = 0; i < minimum.length; i++) {
    const have = version[i] ?? 0;
    if (have !== minimum[i]) return have > minimum[i]!;
  }
  return true;
}

const MIN_VERSION_TEXT = MIN_REDIS_VERSION.join('.');

export function assessRedis(facts: RedisFacts, settings: RedisRequirementSettings): RedisAssessment {
  const fatal: RedisProblem[] = [];
  const warnings: RedisWarning[] = [];

  if (facts.version === null) {
    warnings.push({
      code: 'TALLY_REDIS_UNKNOWN',
      message: `Redis did not report redis_version; Tally needs Redis ${MIN_VERSION_TEXT} or newer (the script probe checks what it can)`,
    });
  } else {
    const version = parseVersion(facts.version);
    if (version === null || !versionAtLeast(version, MIN_REDIS_VERSION)) {
      fatal.push({
        code: 'TALLY_REDIS_VERSION',
        message: `Redis ${facts.version} is too old: Tally's scripts need Redis ${MIN_VERSION_TEXT} or newer (#!lua script flags); upgrade Redis to ${MIN_VERSION_TEXT}+`,
      });
    }
  }

  const policy = facts.maxmemoryPolicy;
  if (policy === null) {
    warnings.push({
      code: 'TALLY_REDIS_UNKNOWN',
      message: 'could not read maxmemory-policy (CONFIG GET refused and INFO has no maxmemory_policy); make sure it is noeviction',
    });
  } else if (policy !== 'noeviction') {
    if (settings.allowEviction) {
      warnings.push({
        code: 'TALLY_REDIS_EVICTION_ALLOWED',
        message: `Redis maxmemory-policy is ${policy}, allowed by TALLY_ALLOW_EVICTION: under memory pressure Redis may evict counts (lost) or markers (counted twice)`,
      });
    } else {
      fatal.push({
        code: 'TALLY_REDIS_EVICTION_POLICY',
        message:
          `Redis maxmemory-policy is ${policy}: every Tally key has a TTL, so Redis may evict counts (lost) or markers (counted twice); ` +
          'run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or set TALLY_ALLOW_EVICTION=1 to accept the risk',
      });
    }
  }

  if (!facts.aofEnabled && facts.connectedReplicas === 0) {
    warnings.push({
      code: 'TALLY_REDIS_NOT_DURABLE',
      message:
        'neither AOF nor a replica protects acked counts: a Redis restart loses what was written since its last snapshot; ' +
        'set appendonly yes, or add replicas and TALLY_REDIS_WAIT_REPLICAS',
    });
  }
  if (settings.waitReplicas > facts.connectedReplicas) {
    warnings.push({
      code: 'TALLY_REDIS_FEW_REPLICAS',
      message:
        `TALLY_REDIS_WAIT_REPLICAS is ${settings.waitReplicas} but Redis has ${facts.connectedReplicas} connected replica(s): ` +
        'acks will wait (retrying each TALLY_REDIS_WAIT_TIMEOUT_MS) until enough replicas connect',
    });
  }
  return { fatal, warnings };
}

/** What an error thrown by ioredis or Node carries. */
export interface RedisFailure {
  readonly message?: string;
  readonly code?: string;
}

function oneLine(text: string): string {
  return text.replace(/\s+/g, ' ').trim();
}

/**
 * Classifies an error met while connecting or probing. A configuration
 * problem (credentials, ACL, scripting, TLS trust) is returned with its fix;
 * anything else (refused connection, timeout, LOADING, a cluster's MOVED,
 * TRYAGAIN or CLUSTERDOWN during a failover) is null: an outage, which the
 * caller waits out.
 *
 * `step` names what was being done, e.g. "EVALSHA (Tally's scripts)".
 */
export function classifyRedisFailure(error: RedisFailure | null | undefined, step = 'connecting'): RedisProblem | null {
  if (error === null || error === undefined) return null;
  const message = oneLine(error.message ?? '');
  const code = error.code ?? '';
  if (/^(WRONGPASS|NOAUTH)\b/.test(message) || /invalid password/i.test(message)) {
    return {
      code: 'TALLY_REDIS_AUTH',
      message: `Redis refused the credentials (${message}); put the right user and password in TALLY_REDIS_URL (redis://user:password@host:port)`,
    };
  }
  if (/^NOPERM\b/.test(message)) {
    return {
      code: 'TALLY_REDIS_NOPERM',
      message:
        `Redis ACL refused ${step} (${message}); grant Tally's user what it needs, e.g. ` +
        'ACL SETUSER <user> ~<TALLY_PREFIX>* +@read +@write +@scripting +@connection +info +time (see docs/redis-requirements.md)',
    };
  }
  if (/^ERR unknown command '(eval|evalsha|script)'/i.test(message) || /scripting is disabled|lua.*disabled/i.test(message)) {
    return {
      code: 'TALLY_REDIS_SCRIPTING',
      message: `Redis refused ${step} (${message}): Tally needs Lua scripting (EVALSHA, SCRIPT LOAD); enable them (no rename-command for EVAL/EVALSHA/SCRIPT)`,
    };
  }
  if (/Error compiling script|user_script:\d+:/i.test(message)) {
    return {
      code: 'TALLY_REDIS_SCRIPTING',
      message: `Redis could not compile Tally's probe script (${message}): it needs Redis ${MIN_VERSION_TEXT}+ with standard Lua scripting`,
    };
  }
  if (CERTIFICATE_ERRORS.has(code)) {
    return {
      code: 'TALLY_REDIS_TLS',
      message: `the TLS certificate of Redis is not trusted (${code}: ${message}); for a private CA set NODE_EXTRA_CA_CERTS=/path/to/ca.pem (verification stays on)`,
    };
  }
  if (code === HOST_MISMATCH_ERROR) {
    return {
      code: 'TALLY_REDIS_TLS',
      message: `the TLS certificate of Redis does not name the host in TALLY_REDIS_URL (${message}); use a host name or IP the certificate lists`,
    };
  }
  if (/wrong version number|packet length too long|unknown protocol/i.test(message) || code === 'ERR_SSL_WRONG_VERSION_NUMBER') {
    return plaintextPortProblem(message);
  }
  return null;
}

/** `rediss://` aimed at a port that speaks plaintext RESP. */
export function plaintextPortProblem(detail: string): RedisProblem {
  return {
    code: 'TALLY_REDIS_TLS',
    message: `the Redis port does not speak TLS (${detail}); use the server's tls-port with rediss://, or redis:// for a plaintext port`,
  };
}

/** The first fatal problem as an error to throw, or null. */
export function requirementError(problems: readonly RedisProblem[]): RedisRequirementError | null {
  const first = problems[0];
  return first === undefined ? null : new RedisRequirementError(first.code, first.message);
}
