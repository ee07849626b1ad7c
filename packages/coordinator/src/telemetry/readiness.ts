/**
 * What /readyz answers: ready, or not ready with the reasons an operator can
 * act on (joined by "; ", the cause first: a Redis that refuses every write
 * explains the stall it causes) and when the earliest began. Pure: the
 * daemon gathers the facts, this words them.
 */
import { describeShortMaster } from '@tally/shared';
import type { RedisRefusalState } from '../redis/redis-health.js';
import { describeKind } from '../redis/redis-health.js';
import type { ShortMasterSince } from '../redis/replica-watch.js';

export interface ReadinessFacts {
  readonly state: string;
  readonly consuming: boolean;
  readonly redisConnected: boolean;
  readonly refusal: RedisRefusalState | null;
  /** Behind Sentinel: the failover in progress (sentinel-watch.ts), or null. */
  readonly failover?: { readonly reason: string; readonly sinceMs: number | null } | null;
  /** Masters with fewer online replicas than TALLY_REDIS_WAIT_REPLICAS (replica-watch.ts); empty without a WAIT. */
  readonly replicasShort?: readonly ShortMasterSince[];
  /** TALLY_SOURCE=stream: partitions refused because their stream is not the one checkpointed (stream-source.ts). */
  readonly refusedPartitions?: ReadonlyArray<{ readonly partition: number; readonly reason: string }>;
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
  const reasons: Array<{ text: string; sinceMs: number | null }> = [];
  // A failover explains the refusals and the lost connection that come with it: named first.
  if (facts.failover) reasons.push({ text: facts.failover.reason, sinceMs: facts.failover.sinceMs });
  if (facts.refusal !== null) {
    reasons.push({ text: `${describeKind(facts.refusal.errorType)}: ${facts.refusal.message}`, sinceMs: facts.refusal.sinceMs });
  }
  // An unmeetable WAIT names its master and shards: the cause of the stall that follows.
  for (const master of facts.replicasShort ?? []) reasons.push({ text: describeShortMaster(master), sinceMs: master.sinceMs });
  if (!facts.redisConnected) reasons.push({ text: 'redis connection down', sinceMs: null });
  // A refused partition is why its daemon does not consume everything it owns: named, with the fix.
  const refused = facts.refusedPartitions ?? [];
  for (const { partition, reason } of refused)
    reasons.push({
      text: `stream partition ${partition} refused: ${reason}; tally stream reset --partition ${partition} counts the new stream`,
      sinceMs: null,
    });
  if (!facts.consuming && refused.length === 0) reasons.push({ text: 'not consuming from RabbitMQ', sinceMs: null });
  if (facts.oldestUnackedMs !== null && facts.oldestUnackedMs >= facts.stallMs) {
    // Also when a refusal explains it: the stall is what the broker's consumer_timeout and the markers' TTL run against.
    reasons.push({
      text: `stalled: oldest unacked delivery ${Math.floor(facts.oldestUnackedMs / 1000)} s old`,
      sinceMs: facts.nowMs - facts.oldestUnackedMs + facts.stallMs,
    });
  }
  if (reasons.length === 0) return READY;
  const dated = reasons.filter((reason) => reason.sinceMs !== null).map((reason) => reason.sinceMs!);
  return {
    ready: false,
    reason: reasons.map((reason) => reason.text).join('; '),
    since: dated.length === 0 ? null : new Date(Math.min(...dated)).toISOString(),
  };
}
