/**
 * The start-up probe: reads what the Redis behind TALLY_REDIS_URL is and may
 * do, before the daemon writes anything. The rules live in
 * @tally/shared redis-requirements.ts; this file only asks the server.
 *
 *   connect (AUTH)                    wrong password, TLS trust   -> fatal
 *   INFO                              version, cluster, AOF, replicas, loading
 *   CONFIG GET maxmemory-policy       (INFO's maxmemory_policy when CONFIG is refused or renamed)
 *   MGET marker / HGETALL layout      ACL key patterns for reads
 *   SCRIPT LOAD + EVALSHA             scripting allowed, #!lua understood, and the
 *                                     writes Tally's scripts make, on a key of each family
 *
 * A configuration problem throws RedisRequirementError (one line, the fix in
 * it); an outage (refused connection, timeout, still loading) throws a plain
 * error that the caller's retry loop waits out, as for any outage.
 */
import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import type { Redis } from 'ioredis';
import {
  assessRedis,
  classifyRedisFailure,
  countKey,
  factsFromInfo,
  layoutKey,
  markerBaseKey,
  plaintextPortProblem,
  receiptKey,
  RedisRequirementError,
  requirementError,
  type RedisFacts,
  type RedisFailure,
  type RedisWarning,
  type TallyConfig,
} from '@tally/shared';
import { createRedisClient } from '@tally/runtime';

/** What the daemon reports about its Redis (status, /readyz detail, gauges). */
export interface RedisProbeReport {
  readonly version: string | null;
  readonly maxmemoryPolicy: string | null;
  /** Running on an evicting policy because TALLY_ALLOW_EVICTION says so. */
  readonly evictionAllowed: boolean;
  readonly aofEnabled: boolean;
  readonly connectedReplicas: number;
  readonly warnings: readonly RedisWarning[];
}

export interface ProbeLog {
  warn(fields: Record<string, unknown>, message: string): void;
}

/**
 * Exercises, in one atomic script, every command Tally's own scripts run, on
 * one key of each family they touch (count, marker, receipt), so an ACL that
 * lacks a command or a key pattern is refused here and not mid-stream. The
 * keys carry a random id and end with a 1 ms TTL; time is frozen inside a
 * script, so no reader ever sees them.
 */
const PROBE_SCRIPT = `#!lua
local now = tonumber(redis.call('TIME')[1])
for i = 1, #KEYS do
  if i == 2 then
    -- The marker family: small hashes (markers.ts).
    redis.call('HSET', KEYS[i], 'probe', '1', 'n', '0')
    redis.call('HGET', KEYS[i], 'probe')
    redis.call('HMGET', KEYS[i], 'probe', 'other')
    redis.call('HINCRBY', KEYS[i], 'n', 1)
    redis.call('HDEL', KEYS[i], 'probe')
    redis.call('EXPIREAT', KEYS[i], now + 1)
    redis.call('PEXPIRE', KEYS[i], 1)
  else
    redis.call('SET', KEYS[i], '0', 'PX', 1000)
    redis.call('INCRBY', KEYS[i], 1)
    redis.call('EXPIRE', KEYS[i], 1)
    redis.call('EXISTS', KEYS[i])
    redis.call('GET', KEYS[i])
    redis.call('SET', KEYS[i], '0', 'PX', 1)
  end
end
return #KEYS
`;

type ProbeConfig = Pick<TallyConfig, 'redisUrl' | 'prefix' | 'allowEviction' | 'redisWaitReplicas'>;

/** Runs `step`; a configuration failure becomes RedisRequirementError, anything else propagates as an outage. */
async function attempt<T>(what: string, lastClientError: () => RedisFailure | null, step: () => Promise<T>): Promise<T> {
  try {
    return await step();
  } catch (error) {
    // A failed AUTH or TLS handshake shows on the client's 'error' event; the
    // command itself may only see "Connection is closed".
    const problem = classifyRedisFailure(error as RedisFailure, what) ?? classifyRedisFailure(lastClientError(), what);
    if (problem !== null) throw new RedisRequirementError(problem.code, problem.message);
    throw error;
  }
}

async function maxmemoryPolicyFromConfig(redis: Redis): Promise<string | null> {
  try {
    const reply = (await redis.config('GET', 'maxmemory-policy')) as unknown;
    // RESP2: ['maxmemory-policy', 'noeviction']
    return Array.isArray(reply) && typeof reply[1] === 'string' ? reply[1] : null;
  } catch {
    // CONFIG is often disabled or renamed on managed Redis: INFO says it too.
    return null;
  }
}

/**
 * A TLS ClientHello sent to a plaintext Redis port gets no answer (Redis waits
 * for the end of an inline command), so `rediss://` aimed at such a port looks
 * like a timeout, an outage retried forever. After a failed TLS connect, one
 * plaintext PING (no credentials) tells the two apart: a RESP reply means the
 * port speaks plaintext and the URL is wrong.
 */
export function speaksPlainRedis(host: string, port: number, timeoutMs = 1_000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    const done = (answer: boolean): void => {
      socket.destroy();
      resolve(answer);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('error', () => done(false));
    socket.once('connect', () => socket.write('PING\r\n'));
    // +PONG, or -NOAUTH / -ERR from a server with a password: RESP either way.
    socket.once('data', (data) => done(/^[+-]/.test(data.toString('latin1'))));
  });
}

async function tlsAimedAtPlainPort(redisUrl: string): Promise<boolean> {
  const url = new URL(redisUrl);
  if (url.protocol !== 'rediss:') return false;
  return speaksPlainRedis(url.hostname.replace(/^\[|\]$/g, ''), Number(url.port || 6379));
}

/** Probes Redis once. Throws RedisRequirementError on a configuration problem, a plain Error on an outage. */
export async function probeRedis(config: ProbeConfig, log: ProbeLog): Promise<RedisProbeReport> {
  const redis = createRedisClient(config.redisUrl, 'tally-probe', {
    lazyConnect: true,
    // The probe reads INFO itself; ioredis's ready check would print its own warning when INFO is refused.
    enableReadyCheck: false,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
  });
  let lastError: RedisFailure | null = null;
  redis.on('error', (error: RedisFailure) => {
    lastError = error;
  });
  const last = (): RedisFailure | null => lastError;
  try {
    await attempt('connecting', last, () => redis.connect()).catch(async (error: unknown) => {
      if (!(error instanceof RedisRequirementError) && (await tlsAimedAtPlainPort(config.redisUrl))) {
        const problem = plaintextPortProblem('the TLS handshake got no answer, a plaintext PING did');
        throw new RedisRequirementError(problem.code, problem.message);
      }
      throw error;
    });
    const info = await attempt('INFO', last, () => redis.info());
    let facts: RedisFacts = factsFromInfo(info);
    if (facts.loading) throw new Error('redis is loading its data set');
    const configPolicy = await maxmemoryPolicyFromConfig(redis);
    if (configPolicy !== null) facts = { ...facts, maxmemoryPolicy: configPolicy };

    const assessment = assessRedis(facts, { allowEviction: config.allowEviction, waitReplicas: config.redisWaitReplicas });
    for (const problem of assessment.fatal.slice(1)) log.warn({ code: problem.code }, problem.message);
    const fatal = requirementError(assessment.fatal);
    if (fatal !== null) throw fatal;

    const id = `probe-${randomUUID()}`;
    const markerProbeKey = `${markerBaseKey(config.prefix, 0)}:${id}`;
    await attempt('HGET of a marker hash', last, () => redis.hget(markerProbeKey, 'probe'));
    await attempt('HGETALL of the layout key', last, () => redis.hgetall(layoutKey(config.prefix)));
    const sha = await attempt('SCRIPT LOAD', last, () => redis.script('LOAD', PROBE_SCRIPT) as Promise<string>);
    const keys = [countKey(config.prefix, 0, id), markerProbeKey, receiptKey(config.prefix, 0, id)];
    await attempt("EVALSHA of Tally's scripts", last, () => redis.evalsha(sha, keys.length, ...keys));

    for (const warning of assessment.warnings) log.warn({ code: warning.code }, warning.message);
    return Object.freeze({
      version: facts.version,
      maxmemoryPolicy: facts.maxmemoryPolicy,
      evictionAllowed: facts.maxmemoryPolicy !== null && facts.maxmemoryPolicy !== 'noeviction',
      aofEnabled: facts.aofEnabled,
      connectedReplicas: facts.connectedReplicas,
      warnings: assessment.warnings,
    });
  } finally {
    redis.disconnect();
  }
}

/**
 * For one-shot clients (the CLI): remembers the client's last connection
 * error, and turns a failure into the configuration problem behind it, if
 * there is one, so the user reads the fix instead of "Connection is closed".
 */
export function explainRedisFailures(redis: Redis): (error: unknown) => unknown {
  let lastError: RedisFailure | null = null;
  redis.on('error', (error: RedisFailure) => {
    lastError = error;
  });
  return (error) => {
    const problem = classifyRedisFailure(error as RedisFailure) ?? classifyRedisFailure(lastError);
    return problem === null ? error : new RedisRequirementError(problem.code, problem.message);
  };
}
