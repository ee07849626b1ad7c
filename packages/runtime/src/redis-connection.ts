import { Redis, type RedisOptions } from 'ioredis';
import { backoffDelay, type BackoffOptions } from '@tally/shared';

/** ioredis's own reconnects: quicker than the step retries, since a reconnect is cheap and nothing waits on its log. */
export const RECONNECT_BACKOFF: BackoffOptions = Object.freeze({ baseMs: 50, capMs: 2_000 });

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
    retryStrategy: (times) => backoffDelay(times, RECONNECT_BACKOFF),
    ...overrides,
  });
}
