/**
 * The deviation estimator (`tally deviation`): how large the overcount that
 * crashes leave behind can be, as arithmetic. Pure: counters, configuration and a crash pattern in, an
 * estimate with every term out.
 *
 * A crash costs re-counted messages in two ways:
 *
 * 1. **Inside the crash window.** A batch whose counts are written and whose
 *    markers are not is counted again on redelivery, however fast the
 *    recovery. Each shard has at most one batch in flight, so a crash costs
 *    at most `min(virtualShards × batchSize, prefetch)` messages. Expected:
 *    W = window_message_ms / loaded_ms, the mean number of messages inside a
 *    window (count write sent, marker occupation not yet) over the time the daemon
 *    is under load: what a crash at a random moment of that time finds.
 * 2. **Recovery slower than the marker TTL.** Everything occupied but not yet
 *    acked comes back after its markers expired and is counted again. Acks
 *    are contiguous multiple-acks, so this can be a good part of the prefetch
 *    window; together with the window it is at most `prefetch` messages.
 *    Expected: U = occupied_unacked_message_ms / loaded_ms.
 *
 *   expected per month = C × W + C × P(recovery > TTL) × U
 *   bound per month    = C × min(V × B, prefetch) + C × P⁺ × prefetch
 *
 * where C is crashes per month and P⁺ the largest P(recovery > TTL) the
 * given percentiles allow. Everything is in messages (a message spread over
 * several shards counts 1/parts per part); multiply by the mean units per
 * message for units.
 */
import { CliUsageError } from './errors.js';
import type { TallyMode, TallySource } from './config.js';

/** One point of the recovery-time distribution: `percentile`% of recoveries take at most `seconds`. */
export interface RecoveryPoint {
  readonly percentile: number;
  readonly seconds: number;
}

const DURATION_UNITS: Readonly<Record<string, number>> = Object.freeze({ ms: 0.001, s: 1, m: 60, h: 3600, d: 86_400 });

/** `90s`, `5m`, `1.5h`, `250ms`, `2d`; a bare number is seconds. */
export function parseDuration(text: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(text.trim());
  if (match === null) throw new CliUsageError(`not a duration: ${JSON.stringify(text)} (expected e.g. 90s, 5m, 1.5h, 250ms)`);
  return Number(match[1]) * DURATION_UNITS[match[2] ?? 's']!;
}

/**
 * `p50=90s,p90=300s,p99=1200s`; `min`/`p0` and `max`/`p100` close the
 * distribution at either end. Times must not decrease as percentiles grow.
 */
export function parseRecovery(text: string): RecoveryPoint[] {
  const points: RecoveryPoint[] = [];
  for (const item of text
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '')) {
    const [key, value, extra] = item.split('=');
    if (key === undefined || value === undefined || extra !== undefined) {
      throw new CliUsageError(`--recovery: expected pNN=DURATION, got ${JSON.stringify(item)}`);
    }
    const name = key.trim().toLowerCase();
    const percentile = name === 'min' ? 0 : name === 'max' ? 100 : /^p\d+(\.\d+)?$/.test(name) ? Number(name.slice(1)) : NaN;
    if (!(percentile >= 0 && percentile <= 100)) {
      throw new CliUsageError(`--recovery: ${JSON.stringify(key)} is not a percentile (p0 to p100, min, max)`);
    }
    points.push({ percentile, seconds: parseDuration(value) });
  }
  if (points.length === 0) throw new CliUsageError('--recovery: give at least one percentile, e.g. p50=90s,p99=20m');
  points.sort((a, b) => a.percentile - b.percentile);
  for (let i = 1; i < points.length; i++) {
    if (points[i]!.percentile === points[i - 1]!.percentile) throw new CliUsageError(`--recovery: p${points[i]!.percentile} given twice`);
    if (points[i]!.seconds < points[i - 1]!.seconds) {
      throw new CliUsageError(`--recovery: p${points[i]!.percentile} is shorter than p${points[i - 1]!.percentile}`);
    }
  }
  return points;
}

/** P(recovery > TTL): the interpolated figure and the range the percentiles allow. */
export interface SlowShare {
  readonly expected: number;
  readonly atLeast: number;
  readonly atMost: number;
  /** How the figure was read off the distribution. */
  readonly how: string;
}

/**
 * Reads P(recovery > ttl) off the percentiles, linearly interpolating the
 * distribution between them (and from zero to the first one unless p0 is
 * given). Past the largest percentile nothing is known, so the whole tail is
 * taken as slow: the expectation equals the bound there, on purpose.
 */
export function slowRecoveryShare(points: readonly RecoveryPoint[], ttlS: number): SlowShare {
  const sorted = [...points].sort((a, b) => a.percentile - b.percentile);
  const first = sorted[0];
  if (first === undefined) throw new CliUsageError('no recovery percentiles');
  const cdf = (p: number) => p / 100;
  const share = (below: number, lowCdf: number, highCdf: number, how: string): SlowShare => ({
    expected: 1 - below,
    atLeast: 1 - highCdf,
    atMost: 1 - lowCdf,
    how,
  });
  if (ttlS < first.seconds) {
    if (first.percentile === 0) return share(0, 0, 0, `TTL below the shortest recovery (${first.seconds} s): every recovery outlasts it`);
    const below = cdf(first.percentile) * (ttlS / first.seconds);
    return share(below, 0, cdf(first.percentile), `TTL below p${first.percentile} (${first.seconds} s): interpolated from 0`);
  }
  for (let i = sorted.length - 1; i >= 0; i--) {
    const low = sorted[i]!;
    if (low.seconds > ttlS) continue;
    const high = sorted[i + 1];
    if (high === undefined) {
      if (low.percentile === 100) return share(1, 1, 1, `TTL at or above the longest recovery (${low.seconds} s): none outlasts it`);
      return share(cdf(low.percentile), cdf(low.percentile), 1, `TTL beyond p${low.percentile} (${low.seconds} s): the whole tail taken as slow`);
    }
    const span = high.seconds - low.seconds;
    const fraction = span === 0 ? 1 : (ttlS - low.seconds) / span;
    const below = cdf(low.percentile) + fraction * (cdf(high.percentile) - cdf(low.percentile));
    return share(
      below,
      cdf(low.percentile),
      cdf(high.percentile),
      `TTL between p${low.percentile} (${low.seconds} s) and p${high.percentile} (${high.seconds} s): interpolated`,
    );
  }
  /* c8 ignore next */
  throw new Error('unreachable: ttl is at least the first point');
}

export interface DeviationConfig {
  readonly mode: TallyMode;
  /** TALLY_SOURCE; `queue` when absent. A stream has no crash window and no marker TTL to outlive: its terms are 0. */
  readonly source?: TallySource;
  readonly markerTtlS: number;
  readonly batchSize: number;
  readonly prefetch: number;
  readonly virtualShards: number;
}

export interface DeviationInputs {
  /** The accumulated counters (`tally stats`); missing ones read as 0. */
  readonly counters: Readonly<Record<string, number | null | string>>;
  readonly config: DeviationConfig;
  readonly crashesPerMonth: number;
  readonly recovery: readonly RecoveryPoint[];
}

/** One line of the sum: what it is, how it is computed, its expectation and bound (messages per month). */
export interface DeviationTerm {
  readonly name: string;
  readonly formula: string;
  readonly expected: number;
  readonly bound: number;
}

export interface DeviationEstimate {
  readonly config: DeviationConfig;
  readonly crashesPerMonth: number;
  readonly slowShare: SlowShare;
  /** Messages at risk when a crash hits the daemon under load, measured (or the bound when nothing was measured). */
  readonly perCrash: {
    readonly window: number;
    readonly windowBound: number;
    readonly occupiedUnacked: number;
    readonly slowBound: number;
    readonly measured: boolean;
    readonly loadedSeconds: number;
  };
  readonly terms: readonly DeviationTerm[];
  readonly expectedPerMonth: number;
  readonly boundPerMonth: number;
  /** What the counters saw so far, for comparison. */
  readonly observed: {
    readonly received: number;
    readonly duplicates: number;
    readonly duplicateRate: number;
    readonly occupationFailures: number;
    readonly redeliveredUnmarked: number;
    readonly partialDuplicates: number;
    /** Messages that may have been counted twice so far: an upper bound from the counters. */
    readonly recountCeiling: number;
    /** Stream source: rollbacks found and replayed (exact), and offsets retention deleted before they were counted (lost: an undercount). */
    readonly streamRollbacks: number;
    readonly streamGapOffsets: number;
  };
}

function counter(counters: DeviationInputs['counters'], name: string): number {
  const value = counters[name];
  return typeof value === 'number' && Number.isFinite(value) ? value : 0;
}

export function estimateDeviation(inputs: DeviationInputs): DeviationEstimate {
  const { config, counters, crashesPerMonth: c } = inputs;
  if (!(c >= 0) || !Number.isFinite(c)) throw new CliUsageError(`--crashes-per-month: expected a number of at least 0, got ${c}`);
  const slowShare = slowRecoveryShare(inputs.recovery, config.markerTtlS);

  // A shard has at most one batch in flight, and no more than `prefetch`
  // deliveries are unacked: the window holds at most the smaller of the two.
  const stream = config.source === 'stream';
  const windowBound = config.mode === 'atomic' || stream ? 0 : Math.min(config.virtualShards * config.batchSize, config.prefetch);
  // A slow recovery re-counts at most every unacked delivery, window included.
  // A stream re-reads after any recovery, however slow, and its watermarks skip what was applied: nothing.
  const slowBound = stream ? 0 : config.prefetch;

  const loadedMs = counter(counters, 'loaded_ms');
  const measured = loadedMs > 0;
  const window = stream ? 0 : measured ? counter(counters, 'window_message_ms') / loadedMs : windowBound;
  const occupiedUnacked = stream ? 0 : measured ? counter(counters, 'occupied_unacked_message_ms') / loadedMs : slowBound - windowBound;

  const pSlow = slowShare.expected;
  const pMax = slowShare.atMost;
  const terms: DeviationTerm[] = [
    {
      name: 'crash inside the window',
      formula: `C × W = ${fmt(c)} × ${fmt(window)}; bound C × min(V × B, prefetch) = ${fmt(c)} × ${fmt(windowBound)}`,
      expected: c * window,
      bound: c * windowBound,
    },
    {
      name: 'recovery slower than the marker TTL',
      formula: `C × P × U = ${fmt(c)} × ${fmt(pSlow)} × ${fmt(occupiedUnacked)}; bound C × P⁺ × prefetch = ${fmt(c)} × ${fmt(pMax)} × ${fmt(slowBound)}`,
      expected: c * pSlow * occupiedUnacked,
      bound: c * pMax * slowBound,
    },
  ];

  const received = counter(counters, 'received');
  const duplicates = counter(counters, 'duplicates');
  const redeliveredUnmarked = counter(counters, 'redelivered_unmarked');
  const partialDuplicates = counter(counters, 'partial_duplicates');
  return {
    config,
    crashesPerMonth: c,
    slowShare,
    perCrash: { window, windowBound, occupiedUnacked, slowBound, measured, loadedSeconds: loadedMs / 1000 },
    terms,
    expectedPerMonth: terms.reduce((sum, term) => sum + term.expected, 0),
    boundPerMonth: terms.reduce((sum, term) => sum + term.bound, 0),
    observed: {
      received,
      duplicates,
      duplicateRate: received > 0 ? duplicates / received : 0,
      occupationFailures: counter(counters, 'occupation_failures'),
      redeliveredUnmarked,
      partialDuplicates,
      recountCeiling: stream ? 0 : redeliveredUnmarked + partialDuplicates,
      streamRollbacks: counter(counters, 'stream_rollbacks'),
      streamGapOffsets: counter(counters, 'stream_gap_offsets'),
    },
  };
}

/** Short, readable numbers: integers as they are, others to three significant digits. */
export function fmt(value: number): string {
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) >= 100) return value.toFixed(0);
  return Number(value.toPrecision(3)).toString();
}

/** The text `tally deviation` prints. */
export function formatDeviation(estimate: DeviationEstimate): string {
  const { config, perCrash, slowShare, observed } = estimate;
  const lines = [
    config.source === 'stream'
      ? `configuration: stream source (exact by construction: every replay is skipped by the watermarks, there is no crash window), id window ${config.markerTtlS} s, virtual shards V ${config.virtualShards}`
      : `configuration: mode ${config.mode}, marker TTL ${config.markerTtlS} s, batch size B ${config.batchSize}, prefetch ${config.prefetch}, virtual shards V ${config.virtualShards}`,
    `counters: received ${observed.received}, duplicates caught ${observed.duplicates} (${fmt(observed.duplicateRate * 100)}% of received), occupation_failures ${observed.occupationFailures}, redelivered_unmarked ${observed.redeliveredUnmarked}, partial_duplicates ${observed.partialDuplicates}`,
    perCrash.measured
      ? `messages at risk when a crash hits the daemon under load (measured over ${fmt(perCrash.loadedSeconds)} s under load):`
      : 'messages at risk per crash: nothing measured under load yet (loaded_ms is 0), so the bounds stand in:',
    `  W, inside the crash window        ${fmt(perCrash.window).padStart(10)}   (at most ${perCrash.windowBound} = min(V × B, prefetch))`,
    `  U, occupied but not yet acked     ${fmt(perCrash.occupiedUnacked).padStart(10)}   (W + U at most ${perCrash.slowBound} = prefetch)`,
    `crash pattern: C = ${fmt(estimate.crashesPerMonth)} crashes per month; P = P(recovery > ${config.markerTtlS} s) = ${fmt(slowShare.expected)} (from ${fmt(slowShare.atLeast)} to P⁺ = ${fmt(slowShare.atMost)}); ${slowShare.how}`,
    'overcount per month, in messages:',
  ];
  for (const term of estimate.terms) {
    lines.push(`  ${term.name.padEnd(38)} expected ${fmt(term.expected).padStart(10)}   bound ${fmt(term.bound).padStart(10)}`);
    lines.push(`    ${term.formula}`);
  }
  lines.push(`  ${'total'.padEnd(38)} expected ${fmt(estimate.expectedPerMonth).padStart(10)}   bound ${fmt(estimate.boundPerMonth).padStart(10)}`);
  if (config.source === 'stream')
    lines.push(
      `stream: ${observed.streamRollbacks} rollbacks found and replayed from the log (exact); ${observed.streamGapOffsets} offsets lost to retention before they were counted (an undercount, alerted)`,
    );
  lines.push(
    `so far: at most ${observed.recountCeiling} messages re-counted (redelivered_unmarked + partial_duplicates; an upper bound: it includes redeliveries never processed before)`,
  );
  return lines.join('\n');
}
