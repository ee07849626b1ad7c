/**
 * What every fault scenario checks once its queue is drained: counts against
 * the ground truth (loss, overcount, per-shard excess), the dead-letter queue
 * against the bad messages published, and the estimator's figure in units.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promisify } from 'node:util';
import { estimateDeviation, parseRecovery, shardOf, type DeviationEstimate, type TallyConfig } from '@tally/shared';
import { compareWithTruth, type Publish } from '@tally/workload';
import type { PartsById } from '../test/integration/crash-window.js';
import { drainQueue, CLI } from '../test/integration/harness.js';

export interface CountCheck {
  /** SKUs below their truth: data lost. */
  readonly lostSkus: readonly string[];
  readonly lostUnits: number;
  /** Units above the truth, over all SKUs. */
  readonly overcountUnits: number;
  readonly excessPerShard: number[];
}

/** The one comparison with the truth (`tally verify`'s), grouped per virtual shard. */
export function checkCounts(counts: ReadonlyMap<string, number>, truth: ReadonlyMap<string, number>, virtualShards: number): CountCheck {
  const check = compareWithTruth(counts, truth);
  return { lostSkus: check.below, lostUnits: check.missingUnits, overcountUnits: check.excessUnits, excessPerShard: perShard(check.excess, virtualShards) };
}

function perShard(unitsBySku: ReadonlyMap<string, number>, virtualShards: number): number[] {
  const totals = new Array<number>(virtualShards).fill(0);
  for (const [sku, units] of unitsBySku) totals[shardOf(sku, virtualShards)]! += units;
  return totals;
}

/** A bad message as the suite knows it: identity (body and messageId) and the reason codes it may carry. */
export interface ExpectedBad {
  readonly body: Buffer;
  readonly messageId?: string | undefined;
  /** Acceptable codes; null accepts any. */
  readonly codes: ReadonlySet<string> | null;
}

export function identity(body: Buffer, messageId: unknown): string {
  return createHash('sha256')
    .update(typeof messageId === 'string' ? messageId : '')
    .update('\0')
    .update(body)
    .digest('hex');
}

export interface DeadLetterCheck {
  readonly deadLettered: number;
  /** Expected bad messages absent from `<queue>.dead`. */
  readonly missing: number;
  /** Messages in `<queue>.dead` that were never published as bad. */
  readonly foreign: number;
  /** Extra copies of a bad message (at-least-once into the dead-letter queue after a crash or a dropped channel). */
  readonly repeats: number;
  readonly wrongReasons: string[];
  readonly withoutReason: number;
}

/** Reads (and empties) `<queue>.dead` and matches it against the bad messages published. */
export async function checkDeadLetters(queue: string, expected: readonly ExpectedBad[]): Promise<DeadLetterCheck> {
  const dead = await drainQueue(`${queue}.dead`);
  const wanted = new Map<string, { codes: ReadonlySet<string> | null; seen: number }>();
  for (const bad of expected) wanted.set(identity(bad.body, bad.messageId), { codes: bad.codes, seen: 0 });
  let foreign = 0;
  let repeats = 0;
  let withoutReason = 0;
  const wrongReasons: string[] = [];
  for (const message of dead) {
    const entry = wanted.get(identity(message.content, message.properties.messageId));
    const reason = message.properties.headers?.['x-tally-reason'];
    const code = typeof reason === 'string' ? reason.split(':')[0]! : Buffer.isBuffer(reason) ? reason.toString().split(':')[0]! : undefined;
    if (code === undefined) withoutReason++;
    if (entry === undefined) {
      foreign++;
      continue;
    }
    if (++entry.seen > 1) repeats++;
    if (code !== undefined && entry.codes !== null && !entry.codes.has(code)) {
      wrongReasons.push(`${code} (expected ${[...entry.codes].join(' or ')}) for ${message.content.subarray(0, 80).toString()}`);
    }
  }
  const missing = [...wanted.values()].filter((entry) => entry.seen === 0).length;
  return { deadLettered: dead.length, missing, foreign, repeats, wrongReasons, withoutReason };
}

/** Units of the workload: mean and largest per good message. */
export function unitsPerMessage(truth: ReadonlyMap<string, number>, goodMessages: number, maxChanges: number, maxDelta: number): { mean: number; max: number } {
  let total = 0;
  for (const value of truth.values()) total += value;
  return { mean: total / goodMessages, max: maxChanges * maxDelta };
}

/**
 * The overcount bound of a run in units: a fast restart costs at most one
 * batch per shard, and never more than the prefetch window of messages; a
 * restart slower than the marker TTL costs at most the prefetch window. No
 * crash, no overcount.
 */
export function overcountBound(
  config: Pick<TallyConfig, 'virtualShards' | 'batchSize' | 'prefetch'>,
  fastKills: number,
  slowKills: number,
  maxUnitsPerMessage: number,
): number {
  const perFastKill = Math.min(config.virtualShards * config.batchSize, config.prefetch);
  return (fastKills * perFastKill + slowKills * config.prefetch) * maxUnitsPerMessage;
}

/** The estimator on this run: its kills as the month's crashes, its restart delays as the recovery distribution. */
export function estimateRun(
  counters: Record<string, number>,
  config: Pick<TallyConfig, 'mode' | 'markerTtlS' | 'batchSize' | 'prefetch' | 'virtualShards'>,
  kills: number,
  recovery: string,
): DeviationEstimate {
  return estimateDeviation({
    counters,
    config: { mode: config.mode, markerTtlS: config.markerTtlS, batchSize: config.batchSize, prefetch: config.prefetch, virtualShards: config.virtualShards },
    crashesPerMonth: kills,
    recovery: parseRecovery(recovery),
  });
}

/** The estimator as an operator runs it: `tally deviation --json` against the scenario's prefix, its kills as the month's crashes. */
export async function deviationFromCli(env: Record<string, string>, kills: number, recovery: string): Promise<DeviationEstimate> {
  const { stdout } = await promisify(execFile)(process.execPath, [CLI, 'deviation', '--crashes-per-month', String(kills), '--recovery', recovery, '--json'], {
    env: { ...process.env, ...env },
  });
  return JSON.parse(stdout) as DeviationEstimate;
}

/**
 * The truth of the first `count` publishes of a workload (a scenario that
 * publishes as it goes and stops before the end): each good message's
 * changes once, from its first publish (a duplicate always follows its
 * original), and how many good messages that is.
 */
export function truthOfPrefix(publishes: readonly Publish[], parts: PartsById, count: number): { truth: Map<string, number>; good: number } {
  const truth = new Map<string, number>();
  let good = 0;
  for (const publish of publishes.slice(0, count)) {
    if (publish.kind !== 'good' || publish.id === undefined) continue;
    good++;
    for (const part of parts.get(publish.id)?.values() ?? []) for (const [sku, delta] of part) truth.set(sku, (truth.get(sku) ?? 0) + delta);
  }
  for (const [sku, value] of truth) if (value === 0) truth.delete(sku);
  return { truth, good };
}
