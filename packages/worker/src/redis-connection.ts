import { Redis, type RedisOptions } from 'ioredis';

/**
 * One place for how Tally talks to Redis. `rediss://` URLs get TLS from
 * ioredis itself; passwords come from the URL.
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
export function createRedisClient(url: string, connectionName: string, overrides: RedisOptions = {}): Redis {
  return new Redis(url, {
    connectionName,
    lazyConnect: false,
    enableReadyCheck: true,
    enableOfflineQueue: true,
    autoResendUnfulfilledCommands: false,
    maxRetriesPerRequest: 0,
    commandTimeout: 10_000,
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 6), 2_000),
    ...overrides,
  });
}

/**
 * Server replies that mean "try again later" rather than "never": retried.
 * Any other ReplyError (overflow, WRONGTYPE) is a refusal that no retry fixes.
 */
export function isTransientReply(message: string): boolean {
  return /^(OOM|LOADING|BUSY|READONLY|MASTERDOWN|TRYAGAIN|CLUSTERDOWN|MOVED|ASK|NOSCRIPT|EXECABORT)\b/.test(message);
}
