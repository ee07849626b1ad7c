/**
 * The start-up probe: reads what the Redis behind TALLY_REDIS_URL is and may
 * do, before the daemon writes anything. The rules live in
 * @tally/shared redis-requirements.ts; this file only asks the server.
 *
 *   SENTINEL MASTER (redis+sentinel)  unknown master name, Sentinel password -> fatal
 *   connect (AUTH)                    wrong password, TLS trust   -> fatal
 *   INFO cluster on the seeds         standalone or Redis Cluster (cluster_enabled:1)
 *   INFO                              version, AOF, replicas, loading
 *   CONFIG GET maxmemory-policy       (INFO's maxmemory_policy when CONFIG is refused or renamed)
 *   HGET marker hash / HGETALL layout ACL key patterns for reads
 *   SCRIPT LOAD + EVALSHA             scripting allowed, #!lua understood, and the
 *                                     writes Tally's scripts make, on a key of each family
 *
 * On a cluster, every master is probed (CLUSTER INFO must say
 * cluster_state:ok; INFO, CONFIG GET, SCRIPT LOAD + EVALSHA on a key of a slot
 * that master serves), and the reads through the cluster client.
 *
 * A configuration problem throws RedisRequirementError (one line, the fix in
 * it); an outage (refused connection, timeout, still loading, a cluster not
 * ok) throws a plain error that the caller's retry loop waits out, as for
 * any outage.
 */
import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import type { Cluster, Redis } from 'ioredis';
import {
  assessRedis,
  classifyRedisFailure,
  countKey,
  factsFromInfo,
  isSentinelUrl,
  layoutKey,
  markerBaseKey,
  plaintextPortProblem,
  receiptKey,
  redactUrl,
  RedisRequirementError,
  requirementError,
  parseSentinelUrl,
  parseVersion,
  versionAtLeast,
  type RedisFacts,
  type RedisFailure,
  type RedisTopology,
  type RedisWarning,
  type TallyConfig,
} from '@tally/shared';
import {
  askSentinels,
  COMMAND_TIMEOUT_MS,
  createRedisClient,
  detectRedisTopology,
  keySlot,
  ONE_SHOT,
  whenClusterReady,
  type RedisClient,
} from '@tally/runtime';

/** What the daemon reports about its Redis (status, /readyz detail, gauges). */
export interface RedisProbeReport {
  /** What TALLY_REDIS_URL points at; the daemon hands it to its worker threads. */
  readonly topology: RedisTopology;
  /** Masters probed: 1 on a standalone Redis. */
  readonly masters: number;
  /** The lowest version among the masters. */
  readonly version: string | null;
  readonly maxmemoryPolicy: string | null;
  /** Running on an evicting policy because TALLY_ALLOW_EVICTION says so. */
  readonly evictionAllowed: boolean;
  /** On every master. */
  readonly aofEnabled: boolean;
  /** The fewest any master has: what TALLY_REDIS_WAIT_REPLICAS can count on. */
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
  if (isSentinelUrl(redisUrl)) return false;
  const url = new URL(redisUrl);
  if (url.protocol !== 'rediss:') return false;
  return speaksPlainRedis(url.hostname.replace(/^\[|\]$/g, ''), Number(url.port || 6379));
}

/**
 * How long a `rediss://` connect may go without an answer before the
 * plaintext PING is tried beside it. A healthy TLS handshake takes
 * milliseconds; a plaintext port never answers one, and waiting out the
 * connect timeout (10 s) made the one clear line come that much later. Not
 * at once: a plaintext PING to a TLS port is a handshake error in that
 * server's log, which a healthy start should not leave.
 */
export const TLS_SUSPECT_MS = 1_500;

/** The topology, or the refusal of a `rediss://` URL aimed at a plaintext port as soon as a plaintext PING proves it. */
async function detectTopology(redisUrl: string): Promise<Awaited<ReturnType<typeof detectRedisTopology>>> {
  const seed = splitFirst(redisUrl);
  const plainPort = (): RedisRequirementError => {
    const problem = plaintextPortProblem('the TLS handshake got no answer, a plaintext PING did');
    return new RedisRequirementError(problem.code, problem.message);
  };
  const detection = attempt(
    'connecting',
    () => null,
    () => detectRedisTopology(redisUrl),
  );
  let timer: NodeJS.Timeout | undefined;
  const suspect = new Promise<'plain'>((resolve) => {
    if (isSentinelUrl(seed) || new URL(seed).protocol !== 'rediss:') return;
    timer = setTimeout(() => {
      void tlsAimedAtPlainPort(seed).then((plain) => {
        if (plain) resolve('plain');
      });
    }, TLS_SUSPECT_MS);
  });
  try {
    const first = await Promise.race([detection, suspect]);
    if (first !== 'plain') return first;
    // The TLS attempt is still pending: it ends on its own timeout, unheard.
    detection.catch(() => {});
    throw plainPort();
  } catch (error) {
    if (error instanceof RedisRequirementError || !(await tlsAimedAtPlainPort(seed))) throw error;
    throw plainPort();
  } finally {
    clearTimeout(timer);
  }
}

/** Probes Redis once. Throws RedisRequirementError on a configuration problem, a plain Error on an outage. */
export async function probeRedis(config: ProbeConfig, log: ProbeLog): Promise<RedisProbeReport> {
  const sentinel = isSentinelUrl(config.redisUrl);
  if (sentinel) await probeSentinels(config.redisUrl);
  const topology = await detectTopology(config.redisUrl);
  const redis = createRedisClient(
    config.redisUrl,
    'tally-probe',
    {
      lazyConnect: true,
      // The probe reads INFO itself; ioredis's ready check would print its own warning when INFO is refused.
      enableReadyCheck: false,
      ...ONE_SHOT,
    },
    topology,
  );
  let lastError: RedisFailure | null = null;
  redis.on('error', (error: RedisFailure) => {
    lastError = error;
  });
  const last = (): RedisFailure | null => lastError;
  try {
    if (topology === 'cluster') {
      // connect() of a cluster that is not ok never settles (ioredis retries its ready check): wait for ready, bounded.
      redis.connect().catch(() => {});
      await attempt('connecting', last, () => whenClusterReady(redis as Cluster));
    } else {
      await attempt('connecting', last, () => redis.connect());
    }
    const masters = topology === 'cluster' ? await clusterMasters(redis as Cluster) : [redis as Redis];
    const probed: MasterProbe[] = [];
    for (const master of masters) probed.push(await probeMaster(master, redis, config, last));

    const id = `probe-${randomUUID()}`;
    const markerProbeKey = `${markerBaseKey(config.prefix, 0)}:${id}`;
    await attempt('HGET of a marker hash', last, () => redis.hget(markerProbeKey, 'probe'));
    await attempt('HGETALL of the layout key', last, () => redis.hgetall(layoutKey(config.prefix)));

    const facts = combinedFacts(probed.map((p) => p.facts));
    const assessment = assessRedis(facts, { allowEviction: config.allowEviction, waitReplicas: config.redisWaitReplicas });
    for (const warning of assessment.warnings) log.warn({ code: warning.code }, warning.message);
    return Object.freeze({
      topology,
      masters: masters.length,
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

  /** One master: its facts and fatal problems (the first stops the start), and the script probe on a slot it serves. */
  async function probeMaster(master: Redis, client: RedisClient, settings: ProbeConfig, lastClientError: () => RedisFailure | null): Promise<MasterProbe> {
    const where = topology === 'cluster' ? ` on ${master.options.host}:${master.options.port}` : '';
    if (topology === 'cluster') {
      const state = /^cluster_state:(\w+)/m.exec(await attempt(`CLUSTER INFO${where}`, lastClientError, () => master.cluster('INFO') as Promise<string>))?.[1];
      // A cluster that is failing over or missing slots: an outage, waited out.
      if (state !== 'ok') throw new Error(`redis cluster_state is ${state ?? 'unknown'}${where}; waiting for the cluster to be ok`);
    }
    const info = await attempt(`INFO${where}`, lastClientError, () => master.info());
    let facts: RedisFacts = factsFromInfo(info);
    if (facts.loading) throw new Error(`redis is loading its data set${where}`);
    // The Sentinels named a node that is not (or no longer) a primary: a failover is under way; an outage, waited out.
    if (sentinel && !/^role:master\s*$/m.test(info))
      throw new Error('the node the Sentinels name as primary answers as a replica; waiting for the failover to settle');
    const configPolicy = await maxmemoryPolicyFromConfig(master);
    if (configPolicy !== null) facts = { ...facts, maxmemoryPolicy: configPolicy };

    const assessment = assessRedis(facts, { allowEviction: settings.allowEviction, waitReplicas: 0 });
    for (const problem of assessment.fatal.slice(1)) log.warn({ code: problem.code }, problem.message);
    const fatal = requirementError(assessment.fatal);
    if (fatal !== null)
      throw topology === 'cluster' ? new RedisRequirementError(fatal.code, `${fatal.message} (${master.options.host}:${master.options.port})`) : fatal;

    // Scripts run on the master of their keys' slot: probe each master with keys of a slot it serves.
    const shard = topology === 'cluster' ? shardServedBy(client as Cluster, master) : 0;
    const id = `probe-${randomUUID()}`;
    const sha = await attempt(`SCRIPT LOAD${where}`, lastClientError, () => master.script('LOAD', PROBE_SCRIPT) as Promise<string>);
    const keys = [countKey(settings.prefix, shard, id), `${markerBaseKey(settings.prefix, shard)}:${id}`, receiptKey(settings.prefix, shard, id)];
    await attempt(`EVALSHA of Tally's scripts${where}`, lastClientError, () => master.evalsha(sha, keys.length, ...keys));
    return { facts };
  }
}

/**
 * Behind Sentinel, the Sentinels first: a master name they do not monitor or
 * a Sentinel password they refuse is a configuration problem named here
 * (ioredis would report either as "All sentinels are unreachable", an outage
 * retried forever); a Sentinel that does not answer is an outage. With
 * rediss+sentinel://, a Sentinel port that answers a plaintext PING is
 * named as one that does not speak TLS.
 */
async function probeSentinels(redisUrl: string): Promise<void> {
  const target = parseSentinelUrl(redisUrl);
  try {
    await askSentinels(target);
  } catch (error) {
    if (error instanceof RedisRequirementError || !target.tls) throw error;
    const first = target.sentinels[0]!;
    if (await speaksPlainRedis(first.host, first.port)) {
      const problem = plaintextPortProblem(`Sentinel ${first.host}:${first.port}: the TLS handshake got no answer, a plaintext PING did`);
      throw new RedisRequirementError(problem.code, problem.message);
    }
    throw error;
  }
}

interface MasterProbe {
  readonly facts: RedisFacts;
}

function splitFirst(redisUrl: string): string {
  return redisUrl.split(/,\s*(?=rediss?:\/\/)/i)[0]!;
}

/** The cluster's masters once its slot map is loaded; a cluster that has none serving slots is not ready (an outage). */
async function clusterMasters(cluster: Cluster): Promise<Redis[]> {
  await whenClusterReady(cluster);
  const masters = cluster.nodes('master');
  if (masters.length === 0) throw new Error('the Redis Cluster has no master serving slots yet');
  return masters;
}

/** A hash-tag number whose slot `master` serves: the probe's keys `{n}` then reach that master. */
function shardServedBy(cluster: Cluster, master: Redis): number {
  const self = `${master.options.host}:${master.options.port}`;
  for (let shard = 0; shard < 100_000; shard++) {
    if (cluster.slots[keySlot(`{${shard}}`)]?.[0] === self) return shard;
  }
  throw new Error(`no slot of the Redis Cluster map is served by ${self}; the slot map is being refreshed`);
}

/**
 * The facts of a cluster as one Redis: the lowest version, a policy other
 * than noeviction if any master has one, AOF only if every master has it,
 * and the fewest replicas any master has.
 */
export function combinedFacts(each: readonly RedisFacts[]): RedisFacts {
  const [first, ...rest] = each;
  if (first === undefined) throw new Error('no Redis facts to combine');
  return rest.reduce<RedisFacts>(
    (all, facts) => ({
      version: lowerVersion(all.version, facts.version),
      maxmemoryPolicy: all.maxmemoryPolicy !== 'noeviction' && all.maxmemoryPolicy !== null ? all.maxmemoryPolicy : facts.maxmemoryPolicy,
      aofEnabled: all.aofEnabled && facts.aofEnabled,
      connectedReplicas: Math.min(all.connectedReplicas, facts.connectedReplicas),
      clusterEnabled: all.clusterEnabled || facts.clusterEnabled,
      loading: all.loading || facts.loading,
    }),
    first,
  );
}

function lowerVersion(a: string | null, b: string | null): string | null {
  if (a === null || b === null) return a ?? b;
  const [pa, pb] = [parseVersion(a), parseVersion(b)];
  if (pa === null || pb === null) return pa === null ? a : b;
  return versionAtLeast(pa, pb) ? b : a;
}

/**
 * For one-shot clients (the CLI): remembers the client's last connection
 * error, and turns a failure into the configuration problem behind it, if
 * there is one, so the user reads the fix instead of "Connection is closed".
 */
export function explainRedisFailures(redis: RedisClient, url: string): (error: unknown) => unknown {
  let lastError: RedisFailure | null = null;
  redis.on('error', (error: RedisFailure) => {
    lastError = error;
  });
  return (error) => {
    if (isUnanswered(error)) return unansweredError(url);
    const problem = classifyRedisFailure(error as RedisFailure) ?? classifyRedisFailure(lastError);
    return problem === null ? error : new RedisRequirementError(problem.code, problem.message);
  };
}

/** ioredis's rejection of a command the server did not answer within COMMAND_TIMEOUT_MS. */
export function isUnanswered(error: unknown): boolean {
  return error instanceof Error && error.message === 'Command timed out';
}

/** What a CLI user reads instead of ioredis's bare "Command timed out": which server, and what to check. */
export function unansweredError(url: string): Error {
  return new Error(
    `Redis (${redactUrl(url)}) accepted the connection but did not answer within ${COMMAND_TIMEOUT_MS / 1000} s: ` +
      'it is stopped (SIGSTOP, a debugger), busy (a long script or KEYS), or a network path drops its replies; ' +
      'check it with redis-cli PING, then run the command again',
  );
}
