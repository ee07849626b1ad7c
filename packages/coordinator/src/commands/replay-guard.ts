/**
 * Invariant 15: what may have been counted is never replayed blind. Pure:
 * decides, for one dead letter, whether `tally dead replay` may move it back
 * without risking a second count, from its headers, its body and the
 * prefix's marker lifetime. dead-queue.ts applies the verdicts; dead.ts and
 * cli.ts say them.
 *
 * - May it have been counted? A bad message (BAD_MESSAGE_REASONS) never
 *   was: it replays at any age. A `count-refused` message had every part but
 *   the refused one counted and marked. A message the broker dead-lettered
 *   (delivery-limit, rejected, expired, maxlen) may have been counted whole
 *   before it was parked: a daemon that wrote it and died before the ack, a
 *   crash loop past the delivery limit. A dead letter of no known reason is
 *   treated as one of those.
 * - Since when? The markers of what was counted were written before the
 *   message was dead-lettered, so the replay is safe only while now is
 *   within the marker lifetime of the earliest moment it may have been
 *   counted. For `count-refused` that is `x-tally-dead-at` (the daemon sets
 *   it when it first dead-letters the message, right after the batch that
 *   marked its other parts), or `x-tally-first-dead-at` when that is
 *   earlier: a replay that failed again (the key not yet repaired) found the
 *   other parts' markers and wrote none, so they date from the first
 *   dead-lettering, not from the last (firstDeadAt). For the broker's
 *   reasons it is the earliest of the x-death times and the message's own
 *   timestamp property: a message parked by the delivery limit may have
 *   been counted at its first delivery, long before it was parked. No time
 *   at all: it may be any age.
 * - How long do markers live? At least the TALLY_MARKER_TTL_S of the daemon
 *   that wrote them (markers.ts). The CLI knows its own setting; the prefix's
 *   layout records the bucket width its first daemon derived from its own
 *   TTL (ceil(ttl / 2)), so that daemon's TTL was at least 2·width − 1. The
 *   smaller of the two is taken: a CLI run with another TALLY_MARKER_TTL_S
 *   than the daemons' errs on the side of refusing.
 * - Does something of it stand outside the markers? A `count-refused`
 *   message on a Redis Cluster with message-scoped markers counted nothing,
 *   unless Redis refused to undo its increments on another count shard:
 *   those stand, and its dead letter names them (STANDING_COUNTS_HEADER).
 *   No marker covers them, so no age makes the replay safe: it is kept
 *   back until the operator has subtracted each and replays it with
 *   --force. A header that cannot be read is taken to name some. Only a
 *   count-refused letter's is read: a letter the broker parked keeps its
 *   producer's headers, a forged one among them. Redis keeps the same
 *   counts by the message's digest (keys.ts standingKey) for the count TTL,
 *   for a dead letter that lost the header.
 */
import {
  BAD_MESSAGE_REASONS,
  COUNT_REFUSED,
  DEAD_AT_HEADER,
  deliveryParser,
  FIRST_DEAD_AT_HEADER,
  shardOf,
  STANDING_COUNTS_HEADER,
  standingCountsOf,
  type MessageMapping,
  type StandingCounts,
} from '@tally/shared';

/** What a replay of a dead letter could count a second time. */
export type Exposure = 'none' | 'whole' | 'other-parts';

/** Clocks of the daemon, the CLI and Redis differ a little: a replay this close to the end of the marker lifetime is refused too. */
export const CLOCK_MARGIN_MS = 1_000;

export function exposureOf(reason: string): Exposure {
  if ((BAD_MESSAGE_REASONS as readonly string[]).includes(reason)) return 'none';
  if (reason === COUNT_REFUSED) return 'other-parts';
  return 'whole';
}

/**
 * The marker lifetime the replay may rely on, in seconds: the CLI's
 * TALLY_MARKER_TTL_S, lowered to what the prefix's recorded bucket width
 * implies for the daemon that laid it out (2·width − 1, see above).
 */
export function markerLifeS(configTtlS: number, recordedBucketS: number | null): number {
  if (recordedBucketS === null || !Number.isSafeInteger(recordedBucketS) || recordedBucketS < 1) return configTtlS;
  return Math.max(1, Math.min(configTtlS, 2 * recordedBucketS - 1));
}

/** The headers and properties the verdict reads, as amqplib decodes them. */
export interface DeadLetterFacts {
  readonly content: Buffer;
  readonly properties: { readonly messageId?: unknown; readonly timestamp?: unknown; readonly headers?: Record<string, unknown> | undefined };
}

/** Milliseconds since the epoch from a header or property: a number (seconds or ms), amqplib's `{ '!': 'timestamp', value }`, a Date, or digits. */
export function epochMs(value: unknown): number | null {
  let raw: unknown = value;
  if (raw !== null && typeof raw === 'object' && '!' in raw && 'value' in raw) raw = (raw as { value: unknown }).value;
  if (raw instanceof Date) raw = raw.getTime();
  if (typeof raw === 'bigint') raw = Number(raw);
  if (typeof raw === 'string' && /^\d{1,16}$/.test(raw)) raw = Number(raw);
  if (Buffer.isBuffer(raw) && /^\d{1,16}$/.test(raw.toString('latin1'))) raw = Number(raw.toString('latin1'));
  if (typeof raw !== 'number' || !Number.isFinite(raw) || raw <= 0) return null;
  // AMQP timestamps are seconds; some producers put milliseconds there.
  return raw < 1e11 ? raw * 1000 : raw;
}

/**
 * The first time Tally dead-lettered the message: the earlier of its
 * `x-tally-dead-at` (this dead-lettering) and the `x-tally-first-dead-at` a
 * replay carried over from an earlier one; null when neither says.
 */
export function firstDeadAt(headers: Readonly<Record<string, unknown>> | undefined): number | null {
  const times = [epochMs(headers?.[DEAD_AT_HEADER]), epochMs(headers?.[FIRST_DEAD_AT_HEADER])].filter((at): at is number => at !== null);
  return times.length === 0 ? null : Math.min(...times);
}

/** The earliest moment the dead letter may have been counted (see the file comment); null when nothing says. */
export function mayHaveBeenCountedSince(facts: DeadLetterFacts, exposure: Exposure): number | null {
  const headers = facts.properties.headers ?? {};
  const deadAt = firstDeadAt(headers);
  if (exposure === 'other-parts' && deadAt !== null) return deadAt;
  const times: number[] = [];
  const deaths = headers['x-death'];
  if (Array.isArray(deaths)) {
    for (const death of deaths) {
      const at = death !== null && typeof death === 'object' ? epochMs((death as { time?: unknown }).time) : null;
      if (at !== null) times.push(at);
    }
  }
  for (const at of [deadAt, epochMs(facts.properties.timestamp)]) if (at !== null) times.push(at);
  return times.length === 0 ? null : Math.min(...times);
}

/** What a replay of one dead letter risks counting twice, as far as its body tells. */
export interface Risk {
  /** The virtual shards whose parts were (or may have been) counted. */
  readonly countedShards: number[];
  /** The changes in those parts, and the sum of their |delta|: what a second count would add. */
  readonly changes: number;
  readonly units: number;
}

/**
 * The refused shard of a `count-refused` detail, as the daemon writes it
 * (daemon.ts describeCountRefusal): `… (sku "S", key K, delta D)` or
 * `… (shard N)`. null when it cannot be read.
 */
export function refusedShardOf(detail: string, virtualShards: number): number | null {
  const bySku = /\(sku ("(?:[^"\\]|\\.)*"), key /.exec(detail);
  if (bySku !== null) {
    try {
      return shardOf(JSON.parse(bySku[1]!) as string, virtualShards);
    } catch {
      return null;
    }
  }
  const byShard = /\(shard (\d+)\)\s*$/.exec(detail);
  return byShard === null ? null : Number(byShard[1]);
}

/**
 * The parts a replay could count again: every part for `whole`, every part
 * but the refused shard's for `other-parts` (all of them when the refused
 * shard cannot be read: an upper bound). null when the body does not parse.
 */
export function riskOf(facts: DeadLetterFacts, exposure: Exposure, detail: string, virtualShards: number, mapping: MessageMapping | null = null): Risk | null {
  if (exposure === 'none') return { countedShards: [], changes: 0, units: 0 };
  // Read as the daemons read it: through TALLY_MESSAGE_MAPPING when one is declared.
  const parsed = deliveryParser(mapping, { maxBytes: Number.MAX_SAFE_INTEGER })(facts.content, facts.properties);
  if (!parsed.ok) return null;
  const refused = exposure === 'other-parts' ? refusedShardOf(detail, virtualShards) : null;
  const shards = new Set<number>();
  let changes = 0;
  let units = 0;
  for (const { sku, delta } of parsed.message.changes) {
    if (delta === 0) continue;
    const shard = shardOf(sku, virtualShards);
    if (shard === refused) continue;
    shards.add(shard);
    changes++;
    units += Math.abs(delta);
  }
  return { countedShards: [...shards].sort((a, b) => a - b), changes, units };
}

export interface ReplayPolicy {
  readonly markerLifeS: number;
  readonly force: boolean;
  readonly nowMs: number;
  readonly virtualShards: number;
  /** TALLY_MESSAGE_MAPPING, so that a mapped body's parts are found; null or absent: the contract's shape. */
  readonly messageMapping?: MessageMapping | null;
}

/** Counts a dead letter names as standing outside any marker (see the file comment); 'unreadable': its header says some, but not which. */
export type Standing = StandingCounts | 'unreadable';

export type ReplayVerdict =
  /** Never counted, or its markers are still alive: a replay finds them. */
  | { readonly action: 'replay'; readonly exposure: Exposure; readonly ageMs: number | null }
  /** May have been counted and its markers may have expired, or counts of it stand: kept in place. */
  | { readonly action: 'refuse'; readonly exposure: Exposure; readonly ageMs: number | null; readonly risk: Risk | null; readonly standing: Standing | null }
  /** As `refuse`, but --force: replayed, and recorded as a forced replay. */
  | { readonly action: 'force'; readonly exposure: Exposure; readonly ageMs: number | null; readonly risk: Risk | null; readonly standing: Standing | null };

/**
 * `recorded`: the standing counts Redis holds for the letter's message
 * (keys.ts standingKey), which outlive a dead letter that lost its header
 * (the message came back before its dead copy was confirmed, and was
 * refused again with nothing left to undo).
 */
export function replayVerdict(
  facts: DeadLetterFacts,
  reason: string,
  detail: string,
  policy: ReplayPolicy,
  recorded: StandingCounts | null = null,
): ReplayVerdict {
  const exposure = exposureOf(reason);
  const since = exposure === 'none' ? null : mayHaveBeenCountedSince(facts, exposure);
  const ageMs = since === null ? null : Math.max(0, policy.nowMs - since);
  if (exposure === 'none') return { action: 'replay', exposure, ageMs };
  const standing = (reason === COUNT_REFUSED ? recorded : null) ?? standingCountsOf(reason, facts.properties.headers);
  const safeForMs = policy.markerLifeS * 1000 - Math.min(CLOCK_MARGIN_MS, policy.markerLifeS * 200);
  if (standing === null && ageMs !== null && ageMs < safeForMs) return { action: 'replay', exposure, ageMs };
  return {
    action: policy.force ? 'force' : 'refuse',
    exposure,
    ageMs,
    risk: riskOf(facts, exposure, detail, policy.virtualShards, policy.messageMapping ?? null),
    standing,
  };
}

/** Up to this many refused or forced dead letters are listed one by one in the report. */
const LISTED = 20;

export interface RiskEntry {
  readonly position: number;
  readonly id: string | null;
  readonly reason: string;
  /** Seconds since it may have been counted; null when nothing says. */
  readonly ageS: number | null;
  readonly countedShards: number[] | null;
  readonly units: number | null;
}

/** The refused (or forced) dead letters of one run, summed for the one line. */
export class RiskSummary {
  messages = 0;
  /** Messages whose body did not parse: their units are not known. */
  unknownBodies = 0;
  units = 0;
  changes = 0;
  readonly byReason: Record<string, number> = {};
  /** count-refused messages among them, and the parts of theirs that were counted. */
  countRefused = 0;
  countRefusedParts = 0;
  countRefusedUnits = 0;
  /** Dead letters naming counts that stand outside any marker, and those counts summed by key (standingLine). */
  standingMessages = 0;
  /** Of them, those whose header could not be read. */
  standingUnreadable = 0;
  readonly standing = new Map<string, bigint>();
  readonly first: RiskEntry[] = [];

  add(position: number, id: string | null, reason: string, verdict: ReplayVerdict & { action: 'refuse' | 'force' }): void {
    this.messages++;
    this.byReason[reason] = (this.byReason[reason] ?? 0) + 1;
    const { risk } = verdict;
    if (risk === null) this.unknownBodies++;
    else {
      this.units += risk.units;
      this.changes += risk.changes;
    }
    if (verdict.standing !== null) {
      this.standingMessages++;
      if (verdict.standing === 'unreadable') this.standingUnreadable++;
      else for (const [key, delta] of Object.entries(verdict.standing)) this.standing.set(key, (this.standing.get(key) ?? 0n) + BigInt(delta));
    }
    if (verdict.exposure === 'other-parts') {
      this.countRefused++;
      this.countRefusedParts += risk?.countedShards.length ?? 0;
      this.countRefusedUnits += risk?.units ?? 0;
    }
    if (this.first.length < LISTED) {
      this.first.push({
        position,
        id,
        reason,
        ageS: verdict.ageMs === null ? null : Math.round(verdict.ageMs / 100) / 10,
        countedShards: risk?.countedShards ?? null,
        units: risk?.units ?? null,
      });
    }
  }

  toJSON(): Record<string, unknown> {
    return {
      messages: this.messages,
      units: this.units,
      changes: this.changes,
      unknownBodies: this.unknownBodies,
      byReason: this.byReason,
      countRefused: { messages: this.countRefused, countedParts: this.countRefusedParts, countedUnits: this.countRefusedUnits },
      standing: {
        messages: this.standingMessages,
        unreadable: this.standingUnreadable,
        counts: Object.fromEntries([...this.standing].map(([key, delta]) => [key, delta.toString()])),
      },
      first: this.first,
    };
  }
}

/** "10 delivery-limit, 2 count-refused", largest first. */
function byReasonText(byReason: Record<string, number>): string {
  return Object.entries(byReason)
    .sort(([, a], [, b]) => b - a)
    .map(([reason, n]) => `${n} ${reason}`)
    .join(', ');
}

function overcountText(summary: RiskSummary): string {
  const unknown = summary.unknownBodies > 0 ? ` (${summary.unknownBodies} with a body that does not parse, units unknown)` : '';
  const refused =
    summary.countRefused > 0
      ? `; of them ${summary.countRefused} count-refused had their other parts counted (${summary.countRefusedParts} parts, ${summary.countRefusedUnits} units)`
      : '';
  return `up to ${summary.messages} message${summary.messages === 1 ? '' : 's'} and ${summary.units} units counted twice${unknown}${refused}`;
}

/** Standing counts listed by name in a line; the JSON report has them all. */
const STANDING_LISTED = 10;

/** "INCRBY k1 -5, INCRBY k2 3 (and 4 more keys: see --json)": the subtractions that undo the standing counts. */
function subtractionsText(summary: RiskSummary): string {
  const listed = [...summary.standing].slice(0, STANDING_LISTED).map(([key, delta]) => `INCRBY ${key} ${(-delta).toString()}`);
  const more = summary.standing.size - listed.length;
  return `${listed.join(', ')}${more > 0 ? ` (and ${more} more key${more === 1 ? '' : 's'}: see --json)` : ''}`;
}

/** The line for dead letters kept back because counts of theirs stand outside any marker; null when none were. */
export function standingLine(summary: RiskSummary): string | null {
  if (summary.standingMessages === 0) return null;
  const n = summary.standingMessages;
  const unreadable =
    summary.standingUnreadable > 0
      ? `; ${summary.standingUnreadable} of them name theirs in an ${STANDING_COUNTS_HEADER} header that cannot be read: read it with tally dead list`
      : '';
  const subtract = summary.standing.size > 0 ? `: ${subtractionsText(summary)}` : '';
  return (
    `${n} of them ${n === 1 ? 'has' : 'have'} counts that stand on another count shard (Redis refused to undo them: undo_failures in tally stats) ` +
    `and are kept back at any age, since no marker stops a replay from counting those again. Repair each key: if the value you restore includes ` +
    `those increments, subtract them${subtract}; if it is the value from before the message, do not${unreadable}. Then replay them with --force`
  );
}

/** The one line of a replay that kept dead letters back. */
export function refusedLine(summary: RiskSummary, markerLife: number): string {
  return (
    `kept ${summary.messages} dead letter${summary.messages === 1 ? '' : 's'} in place (${byReasonText(summary.byReason)}): ` +
    `they may have been counted and their markers may have expired (older than the ${markerLife} s marker lifetime, or of unknown age)` +
    `${summary.standingMessages > 0 ? ', or counts of theirs stand' : ''}; ` +
    `replaying them risks ${overcountText(summary)}; rerun with --force to replay them anyway`
  );
}

/** The loud line of a --force replay that replayed some of them. */
export function forcedLine(summary: RiskSummary, markerLife: number): string {
  return (
    `FORCED: replayed ${summary.messages} dead letter${summary.messages === 1 ? '' : 's'} (${byReasonText(summary.byReason)}) ` +
    `whose markers may have expired (older than the ${markerLife} s marker lifetime, or of unknown age): ` +
    `${overcountText(summary)}; recorded as forced_replays in tally stats` +
    (summary.standingMessages > 0
      ? `; ${summary.standingMessages} of them had counts standing on another count shard (${summary.standing.size > 0 ? subtractionsText(summary) : 'unreadable'}): replayed as if they were subtracted`
      : '')
  );
}
