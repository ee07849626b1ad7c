/**
 * What /readyz answers: ready, or not ready with one reason an operator can
 * act on and when it began. Pure: the daemon gathers the facts, this ranks
 * them. The first that holds wins, most fundamental first: a daemon that is
 * not running cannot be stalled, and a Redis that refuses every write
 * explains the stall it causes better than the stall does.
 */
import type { RedisRefusalState } from './redis-health.js';
import { describeKind } from './redis-health.js';

export interface ReadinessFacts {
  readonly state: string;
  readonly consuming: boolean;
  readonly redisConnected: boolean;
  readonly refusal: RedisRefusalState | null;
  /** Age of the oldest unacked delivery, ms; null when nothing is unacked. */
  readonly oldestUnackedMs: number | null;
  readonly stallMs: number;
  /** Epoch ms now, to date a stall. */
  readonly nowMs: number;
}

export interface ReadinessVerdict {
  readonly ready: boolean;
  readonly reason: string | null;
  /** ISO time the reason began, when known. */
  readonly since: string | null;
}

const READY: ReadinessVerdict = Object.freeze({ ready: true, reason: null, since: null });

export function judgeReadiness(facts: ReadinessFacts): ReadinessVerdict {
  if (facts.state !== 'running') return { ready: false, reason: `daemon ${facts.state}`, since: null };
  if (facts.refusal !== null) {
    return {
      ready: false,
      reason: `${describeKind(facts.refusal.errorType)}: ${facts.refusal.message}`,
      since: new Date(facts.refusal.sinceMs).toISOString(),
    };
  }
  if (!facts.redisConnected) return { ready: false, reason: 'redis connection down', since: null };
  if (!facts.consuming) return { ready: false, reason: 'not consuming from RabbitMQ', since: null };
  if (facts.oldestUnackedMs !== null && facts.oldestUnackedMs >= facts.stallMs) {
    return {
      ready: false,
      reason: `stalled: oldest unacked delivery ${Math.floor(facts.oldestUnackedMs / 1000)} s old`,
      since: new Date(facts.nowMs - facts.oldestUnackedMs + facts.stallMs).toISOString(),
    };
  }
  return READY;
}
