/**
 * The CLI's Redis: one attempt, no endless reconnects, and a failure read as
 * its fix. A wrong password or an untrusted certificate names the setting;
 * a server that accepted the connection and never answered is named with
 * what to check, not left as ioredis's "Command timed out" or "Connection
 * is closed". Every command that needs Redis goes through withCliRedis, so
 * the explanation is written once.
 */
import { classifyRedisFailure, RedisRequirementError, type RedisFailure } from '@tally/shared';
import { connectRedis, ONE_SHOT, type RedisClient } from '@tally/runtime';
import { explainRedisFailures, isUnanswered, unansweredError } from './redis-probe.js';

/** A one-shot client of the topology the seeds name (standalone, Sentinel or cluster), or the reason it could not be had. */
export async function openCliRedis(url: string): Promise<RedisClient> {
  try {
    return await connectRedis(url, 'tally-cli', ONE_SHOT);
  } catch (error) {
    if (isUnanswered(error)) throw unansweredError(url);
    const problem = classifyRedisFailure(error as RedisFailure);
    throw problem === null ? error : new RedisRequirementError(problem.code, problem.message);
  }
}

/** Runs `use` with a one-shot client, explains what fails on the way, and disconnects. */
export async function withCliRedis<T>(url: string, use: (redis: RedisClient) => Promise<T>): Promise<T> {
  const redis = await openCliRedis(url);
  const explain = explainRedisFailures(redis, url);
  try {
    return await use(redis);
  } catch (error) {
    throw explain(error);
  } finally {
    redis.disconnect();
  }
}
