/**
 * How Tally talks to Redis, standalone, behind Sentinel or a Redis Cluster: connection options that fail
 * fast (the caller retries), topology detection, and the scan and slot helpers.
 */
import { isIP, type Socket } from 'node:net';
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';
import {
  backoffDelay,
  isSentinelUrl,
  joinAddress,
  parseSentinelUrl,
  redactUrl,
  RedisRequirementError,
  splitRedisUrls,
  type BackoffOptions,
  type RedisTopology,
  type SentinelTarget,
} from '@tally/shared';
import { keySlot } from './key-slot.js';
import { askSentinels } from './sentinel-query.js';
import { SentinelPrimaryClient } from './sentinel-primary-client.js';

/** ioredis's own reconnects: quicker than the step retries, since a reconnect is cheap and nothing waits on its log. */
export const RECONNECT_BACKOFF: BackoffOptions = Object.freeze({ baseMs: 50, capMs: 2_000 });

/**
 * For one-shot clients (the CLI, the probe): one attempt, no reconnects, no
 * failover subscriptions (their connections would outlive a quick command).
 */
export const ONE_SHOT: RedisOptions = Object.freeze({ maxRetriesPerRequest: 0, retryStrategy: () => null, failoverDetector: false });

/** A client for either topology. Both speak the same commands; what differs (scans, slots) goes through the helpers below. */
export type RedisClient = Redis | Cluster;

/**
 * The options of every connection Tally opens, standalone or to one node of
 * a cluster.
 *
 * - autoResendUnfulfilledCommands off: after a disconnect ioredis would
 *   otherwise replay a count write that may already have landed. Tally
 *   retries itself, guarded by a write receipt, so a replay is never blind.
 * - maxRetriesPerRequest 0: every command pending on a connection that drops
 *   is rejected at once (with autoResend off ioredis would otherwise forget
 *   it until commandTimeout), and the caller's backoff loop, which logs and
 *   is observable, takes over.
 * - commandTimeout: a server that stops answering is treated as an outage,
 *   not waited on forever.
 */
/** How long a command waits for its reply before ioredis rejects it ("Command timed out"). */
export const COMMAND_TIMEOUT_MS = 10_000;

function connectionOptions(connectionName: string): RedisOptions {
  return {
    connectionName,
    lazyConnect: false,
    enableReadyCheck: true,
    enableOfflineQueue: true,
    autoResendUnfulfilledCommands: false,
    maxRetriesPerRequest: 0,
    commandTimeout: COMMAND_TIMEOUT_MS,
    retryStrategy: (times) => backoffDelay(times, RECONNECT_BACKOFF),
  };
}

/**
 * One place for how Tally talks to Redis. `url` is TALLY_REDIS_URL: one URL,
 * or a Redis Cluster's seed nodes separated by commas. The topology comes
 * from detectRedisTopology (the daemon's probe detects it once and hands it
 * to its worker threads); a standalone client uses the first URL.
 *
 * `rediss://` URLs get TLS from ioredis itself; passwords come from the URL.
 * On a cluster, the first seed's user, password and TLS go to every node the
 * cluster announces (clusterOptions). A `redis+sentinel://` URL gives a
 * standalone client that asks the Sentinels for the primary at every
 * (re)connect (sentinelOptions): the daemon, its threads and the CLI all
 * follow a failover through this one factory, and a client of theirs that
 * ioredis ends mid-failover reconnects (sentinel-primary-client.ts).
 */
export function createRedisClient(url: string, connectionName: string, overrides?: RedisOptions): Redis;
export function createRedisClient(url: string, connectionName: string, overrides: RedisOptions, topology: 'standalone'): Redis;
export function createRedisClient(url: string, connectionName: string, overrides: RedisOptions, topology: RedisTopology): RedisClient;
export function createRedisClient(url: string, connectionName: string, overrides: RedisOptions = {}, topology: RedisTopology = 'standalone'): RedisClient {
  if (isSentinelUrl(url)) return new SentinelPrimaryClient(sentinelOptions(parseSentinelUrl(url), connectionName, overrides));
  const seeds = splitRedisUrls(url);
  if (topology === 'cluster') return new Cluster(seeds.map(seedNode), clusterOptions(seeds[0]!, connectionName, overrides));
  return new Redis(seeds[0] ?? url, { ...connectionOptions(connectionName), ...overrides });
}

/** Reconnects of the failover detector's subscriptions to a Sentinel that went away (ioredis waits a minute by default). */
const SENTINEL_RESUBSCRIBE_BACKOFF: BackoffOptions = Object.freeze({ baseMs: 500, capMs: 10_000 });

/**
 * The options of a client of the primary behind Sentinel. The standalone
 * options above hold (no resend of a command that may have run, every
 * failure to the caller's retry loop); on top of them:
 *
 * - role master, and the ready check on (the default): at every connect
 *   ioredis asks a Sentinel for the primary, then checks that the node says
 *   `role:master` in INFO; a replica answering where the primary was (a
 *   Sentinel not yet told, a demoted node) is dropped and the next Sentinel
 *   asked, before any command is sent on it.
 * - failoverDetector: the client subscribes to `+switch-master` on the
 *   Sentinels and reconnects at once when the primary changes, instead of
 *   writing on to an old primary that is still up (a partition) and being
 *   told READONLY only once it is demoted.
 * - reconnectOnError for READONLY: the node was demoted under the
 *   connection; reconnect (asking the Sentinels again) and fail the command
 *   to the retry loop (1: never resent by ioredis).
 * - sentinelRetryStrategy: the caller's retryStrategy. When no Sentinel
 *   answers, the daemon's clients keep asking with its backoff; a one-shot
 *   client (retryStrategy null: the CLI, the probe) fails at once.
 * - TLS (rediss+sentinel://) to the Sentinels and to the data nodes, both
 *   verified; a CA given by the caller (`overrides.tls`) applies to both.
 *   The primary is reached at the address the Sentinels announce, so its
 *   certificate must name that address.
 */
export function sentinelOptions(target: SentinelTarget, connectionName: string, overrides: RedisOptions = {}): RedisOptions {
  const base = { ...connectionOptions(connectionName), ...overrides };
  const tls = target.tls ? { tls: overrides.tls ?? {}, sentinelTLS: overrides.tls ?? {}, enableTLSForSentinelMode: true } : {};
  return {
    ...base,
    sentinels: target.sentinels.map(({ host, port }) => ({ host, port })),
    name: target.masterName,
    role: 'master',
    db: target.db,
    ...(target.username === null ? {} : { username: target.username }),
    ...(target.password === null ? {} : { password: target.password }),
    ...(target.sentinelUsername === null ? {} : { sentinelUsername: target.sentinelUsername }),
    ...(target.sentinelPassword === null ? {} : { sentinelPassword: target.sentinelPassword }),
    ...tls,
    sentinelRetryStrategy: base.retryStrategy ?? ((times) => backoffDelay(times, RECONNECT_BACKOFF)),
    sentinelReconnectStrategy: (times) => backoffDelay(times, SENTINEL_RESUBSCRIBE_BACKOFF),
    sentinelCommandTimeout: overrides.sentinelCommandTimeout ?? 2_000,
    failoverDetector: overrides.failoverDetector ?? true,
    reconnectOnError: (error) => (/^READONLY\b/.test(error.message) ? 1 : false),
  };
}

/** Whether a client reaches its node through Sentinel. */
export function isSentinelClient(client: RedisClient): boolean {
  return !isCluster(client) && Array.isArray(client.options.sentinels) && client.options.sentinels.length > 0;
}

/**
 * The `host:port` of the node a connection serves: as configured for a
 * standalone node or a cluster node, and for a client behind Sentinel the
 * address its socket reached (the primary of the moment), or null while it
 * has none.
 */
export function nodeAddress(connection: Redis): string | null {
  if (!isSentinelClient(connection)) return `${connection.options.host ?? '127.0.0.1'}:${connection.options.port ?? 6379}`;
  const stream = (connection as unknown as { stream?: Socket }).stream;
  const host = stream?.remoteAddress;
  const port = stream?.remotePort;
  if (connection.status !== 'ready' || host === undefined || port === undefined) return null;
  // An IPv4 peer on a dual-stack socket reads ::ffff:a.b.c.d; the Sentinels announce a.b.c.d.
  return joinAddress(isIP(host) === 6 && host.startsWith('::ffff:') ? host.slice(7) : host, port);
}

function seedNode(url: string): { host: string; port: number } {
  const parsed = new URL(url);
  return { host: parsed.hostname.replace(/^\[|\]$/g, ''), port: Number(parsed.port || 6379) };
}

/**
 * The Cluster client's options.
 *
 * - redisOptions (every node's connection): the standalone options above,
 *   plus the first seed's credentials and TLS. ioredis reaches the nodes by
 *   the addresses the cluster announces (cluster-announce-ip/-hostname), so
 *   they must be reachable from the daemon as announced; no NAT map is used.
 * - MOVED, ASK, TRYAGAIN and CLUSTERDOWN are followed or retried by ioredis:
 *   the command did not run, so running it again is not a replay. Those
 *   redirections are bounded (maxRedirections), then fail to Tally's retry
 *   loop, which waits out the rest of a failover.
 * - retryDelayOnFailover 0: a command whose node connection closed is NOT
 *   resent by ioredis, for the same reason autoResendUnfulfilledCommands is
 *   off: it may have run. Tally's retry loop resends, receipt-guarded.
 * - Node connections never reconnect on their own (ioredis's cluster
 *   default): a lost node is replaced after a slot map refresh, which a
 *   redirection or masterForKey's caller triggers.
 * - With TLS, host names are kept as given (dnsLookup is the identity), so a
 *   certificate that names the host verifies.
 */
export function clusterOptions(firstSeed: string, connectionName: string, overrides: RedisOptions = {}): ClusterOptions {
  const url = new URL(firstSeed);
  const tls = url.protocol === 'rediss:';
  // enableOfflineQueue is the cluster's own (set below); ioredis keeps it on for node connections.
  const { retryStrategy, lazyConnect, enableOfflineQueue: _offlineQueue, ...nodeOverrides } = { ...connectionOptions(connectionName), ...overrides };
  return {
    lazyConnect: lazyConnect ?? false,
    enableReadyCheck: true,
    enableOfflineQueue: true,
    scaleReads: 'master',
    maxRedirections: 16,
    retryDelayOnMoved: 0,
    retryDelayOnTryAgain: 100,
    retryDelayOnClusterDown: 200,
    retryDelayOnFailover: 0,
    slotsRefreshTimeout: 2_000,
    // Picks up masters added or promoted while nothing redirected this client (tally status, scans).
    slotsRefreshInterval: 10_000,
    clusterRetryStrategy: retryStrategy ?? undefined,
    ...(tls ? { dnsLookup: (address: string, callback: (error: null, address: string) => void) => callback(null, address) } : {}),
    redisOptions: {
      ...nodeOverrides,
      ...(url.username ? { username: decodeURIComponent(url.username) } : {}),
      ...(url.password ? { password: decodeURIComponent(url.password) } : {}),
      ...(tls ? { tls: {} } : {}),
    },
  };
}

export function isCluster(client: RedisClient): client is Cluster {
  return client instanceof Cluster;
}

/**
 * Asks the seed nodes, in order, whether they run in cluster mode
 * (`INFO cluster`: cluster_enabled:1). The first that answers decides. Fails
 * with the last connection error when none answers (the caller classifies it:
 * a wrong password is a configuration problem, a refused connection an
 * outage), and with TALLY_REDIS_CLUSTER when several URLs are given but they
 * name a standalone Redis, which has no seeds.
 */
export async function detectRedisTopology(url: string, overrides: RedisOptions = {}): Promise<RedisTopology> {
  // Sentinel monitors a standalone primary (a Redis Cluster fails over by itself); the probe asks the Sentinels first.
  if (isSentinelUrl(url)) return 'standalone';
  const seeds = splitRedisUrls(url);
  let lastError: unknown = new Error('TALLY_REDIS_URL names no Redis');
  for (const seed of seeds) {
    const redis = createRedisClient(seed, 'tally-probe', {
      lazyConnect: true,
      enableReadyCheck: false,
      retryStrategy: () => null,
      maxRetriesPerRequest: 0,
      ...overrides,
    });
    // A failed AUTH or TLS handshake shows on 'error'; the command itself may only see "Connection is closed".
    let connectionError: unknown = null;
    redis.on('error', (error: unknown) => {
      connectionError = error;
    });
    try {
      await redis.connect();
      const info = await redis.info('cluster');
      const cluster = /^cluster_enabled:1\s*$/m.test(info);
      if (!cluster && seeds.length > 1) {
        throw new RedisRequirementError(
          'TALLY_REDIS_CLUSTER',
          `TALLY_REDIS_URL lists ${seeds.length} seed nodes but ${redactUrl(seed)} is a standalone Redis (cluster_enabled:0); ` +
            'give one URL for a standalone Redis, or the nodes of a Redis Cluster',
        );
      }
      return cluster ? 'cluster' : 'standalone';
    } catch (error) {
      if (error instanceof RedisRequirementError) throw error;
      lastError = connectionError ?? error;
    } finally {
      redis.disconnect();
    }
  }
  throw lastError;
}

/** A client of the detected topology: what the CLI and the tests use. The daemon detects once, in its probe. */
export async function connectRedis(url: string, connectionName: string, overrides: RedisOptions = {}): Promise<RedisClient> {
  // Behind Sentinel: the Sentinels first, so a wrong master name or Sentinel password reads as such (sentinel-query.ts).
  if (isSentinelUrl(url)) await askSentinels(parseSentinelUrl(url), overrides.tls === undefined ? {} : { tls: overrides.tls });
  const topology = await detectRedisTopology(url, overrides.tls === undefined ? {} : { tls: overrides.tls });
  const client = createRedisClient(url, connectionName, overrides, topology);
  if (isCluster(client)) await whenClusterReady(client);
  return client;
}

/**
 * Resolves once a cluster client has its slot map and the cluster says
 * cluster_state:ok (ioredis's ready check); rejects when the client ends
 * first, or after `timeoutMs`: a cluster whose state stays "fail" makes
 * ioredis reconnect without ever settling its connect().
 */
export function whenClusterReady(cluster: Cluster, timeoutMs = 10_000): Promise<void> {
  if (cluster.status === 'ready') return Promise.resolve();
  return new Promise((resolve, reject) => {
    const done = (error?: Error): void => {
      clearTimeout(timer);
      cluster.off('ready', onReady);
      cluster.off('end', onEnd);
      if (error) reject(error);
      else resolve();
    };
    const onReady = (): void => done();
    const onEnd = (): void => done(new Error('the Redis Cluster client ended before it had the slot map (no seed node reachable, or cluster_state is not ok)'));
    const timer = setTimeout(
      () => done(new Error(`the Redis Cluster is not ready after ${timeoutMs} ms (cluster_state is not ok, or no seed node answers)`)),
      timeoutMs,
    );
    cluster.once('ready', onReady);
    cluster.once('end', onEnd);
  });
}

/**
 * The connections whose keys together are the whole keyspace: the client
 * itself on a standalone Redis, every master on a cluster (SCAN, like KEYS,
 * answers for one node only). Scanning code walks each of them.
 */
export function scanNodes(client: RedisClient): Redis[] {
  return isCluster(client) ? client.nodes('master') : [client];
}

function refreshSlots(cluster: Cluster): Promise<void> {
  return new Promise((resolve) => cluster.refreshSlotsCache(() => resolve()));
}

function nodeKeyOf(node: Redis): string {
  return `${node.options.host}:${node.options.port}`;
}

/**
 * The connection to the master that serves `key`'s slot: the client itself
 * on a standalone Redis. Commands sent on it are not redirected by ioredis;
 * a reply of MOVED, ASK, TRYAGAIN or CLUSTERDOWN, or a closed connection,
 * reaches the caller's retry loop, and onSlotConnection refreshes the slot
 * map so the next attempt goes to the new owner.
 *
 * A batch's scripts run on it, so that a NOSCRIPT reload (SCRIPT LOAD has no
 * key, and a cluster client would send it to any node) reaches the node that
 * runs the script; and it is the connection a batch's WAIT must follow on a
 * cluster (replica-wait.ts sends its marker touch and WAIT there by key).
 */
export async function masterForKey(client: RedisClient, key: string): Promise<Redis> {
  if (!isCluster(client)) return client;
  const slot = keySlot(key);
  const find = (): Redis | undefined => {
    const owner = client.slots[slot]?.[0];
    return owner === undefined ? undefined : client.nodes('master').find((node) => nodeKeyOf(node) === owner);
  };
  let node = find();
  if (node === undefined) {
    if (client.status !== 'ready') await whenClusterReady(client);
    else await refreshSlots(client);
    node = find();
  }
  if (node === undefined) throw new Error(`no Redis Cluster master is known for slot ${slot} (key ${key}); the slot map is being refreshed`);
  return node;
}

/** Replies that mean the slot map is stale, or the slot's master is not (yet) able to serve it. */
const STALE_SLOT_MAP = /^(MOVED|ASK|TRYAGAIN|CLUSTERDOWN|READONLY|MASTERDOWN)\b/;

/**
 * Runs `work` on the connection of `key`'s master (masterForKey). On a
 * cluster, a failure that may mean the slot moved or its master died
 * refreshes the slot map before it is rethrown to the caller's retry loop.
 */
export async function onSlotConnection<T>(client: RedisClient, key: string, work: (connection: Redis) => Promise<T>): Promise<T> {
  const connection = await masterForKey(client, key);
  try {
    return await work(connection);
  } catch (error) {
    if (isCluster(client)) {
      const reply = error instanceof Error && error.name === 'ReplyError';
      if (!reply || STALE_SLOT_MAP.test((error as Error).message)) client.refreshSlotsCache();
    }
    throw error;
  }
}
