/**
 * What a shard batch's result means for each of its deliveries, and what a
 * delivery whose every part is done becomes: acked and counted as counted,
 * a duplicate or a partial duplicate; dead-lettered `count-refused` when
 * Redis refused one of its parts; its waiting copies acked as duplicates.
 */
import { COUNT_REFUSED, PART_DONE, PART_HELD, PART_REWIND, STANDING_COUNTS_HEADER, type BatchResult, type CountRefusal } from '@tally/shared';
import type { Delivery } from './delivery.js';
import type { PendingPart } from './shard-lanes.js';
import type { AckWindow } from './ack-window.js';
import type { DeadLetters } from './dead-letters.js';
import type { InFlightMessages } from './in-flight.js';
import type { Clock, Counters, Exposure, PipelineMetrics, StreamLog } from './ports.js';

/** Puts a part back into its lane after a delay (shard-lanes.ts hold). */
export type HoldPart = (vshard: number, part: PendingPart, delayMs: number) => void;

export interface SettlementDeps {
  /** How long a part held by another daemon's claim waits before it is tried again. */
  readonly claimRetryMs: number;
  readonly counters: Counters;
  readonly exposure: Exposure;
  readonly metrics: PipelineMetrics | null;
  readonly clock: Clock;
  readonly acks: AckWindow;
  readonly deadLetters: DeadLetters;
  readonly inFlight: InFlightMessages;
  readonly hold: HoldPart;
  /** Stream source: the watermarks a batch moved on, or found gone backwards; null for a queue. */
  readonly streamLog: StreamLog | null;
}

export class Settlement {
  private readonly counters: Counters;
  private readonly exposure: Exposure;
  private readonly metrics: PipelineMetrics | null;
  private readonly acks: AckWindow;

  constructor(private readonly deps: SettlementDeps) {
    this.counters = deps.counters;
    this.exposure = deps.exposure;
    this.metrics = deps.metrics;
    this.acks = deps.acks;
  }

  /** A shard batch returned: count what it reports, then settle each delivery whose last part this was. */
  batchDone(vshard: number, parts: readonly PendingPart[], result: BatchResult): void {
    const { counters } = this;
    const { streamLog } = this.deps;
    // What the batch reports as a whole (counters, spans, the exposure meter) was told by batch-observer.ts.
    if (streamLog !== null)
      for (const report of result.watermarks ?? []) {
        if (report.rolledBack) streamLog.rolledBack(report.partition, vshard, report.offset, report.expected);
        else streamLog.applied(report.partition, vshard, report.offset);
      }
    for (const refusal of result.refusals) {
      const delivery = parts[refusal.part]!.delivery;
      delivery.refusal ??= describeCountRefusal(vshard, refusal);
      if (refusal.standing !== undefined) delivery.standing = addStanding(delivery.standing, refusal.standing);
    }
    let held = 0;
    for (let i = 0; i < parts.length; i++) {
      const delivery = parts[i]!.delivery;
      if (result.marked[i] === PART_REWIND) {
        // Its partition is being replayed from before it: this delivery is read again there, on a new channel.
        this.abandon(delivery);
        continue;
      }
      if (result.marked[i] === PART_HELD) {
        // Another daemon is counting a copy of this message right now: run
        // this part again shortly; by then it is marked (a duplicate) or its
        // claim has run out (that daemon died: counted here).
        held++;
        this.deps.hold(vshard, parts[i]!, this.deps.claimRetryMs);
        this.heldByClaim(delivery);
        continue;
      }
      if (result.marked[i] === PART_DONE) delivery.markedParts++;
      if (--delivery.remaining === 0) this.settle(delivery);
    }
    if (held > 0) {
      counters.add('claim_holds', held);
      this.acks.scheduleSend();
    }
  }

  /**
   * A delivery waiting for another daemon's claim must not hold back the
   * acks behind it: the prefetch window would fill and this daemon count
   * nothing meanwhile. Its copies waiting on it wait as long.
   */
  private heldByClaim(delivery: Delivery): void {
    this.acks.heldByClaim(delivery.link, delivery.tag);
    for (const { link, tag } of delivery.waiters ?? []) this.acks.heldByClaim(link, tag);
  }

  /**
   * Stream source: a delivery that will not finish on its channel (its
   * partition is replayed, or its channel died before its batch left): no
   * longer in flight, never acked; its offsets are read again.
   */
  abandon(delivery: Delivery): void {
    if (delivery.remaining === Number.POSITIVE_INFINITY) return;
    delivery.remaining = Number.POSITIVE_INFINITY;
    this.deps.inFlight.release(delivery);
  }

  /** Every part of a delivery is written and marked: classify it and release its waiters. */
  private settle(delivery: Delivery): void {
    const { counters, metrics, acks } = this;
    this.deps.inFlight.release(delivery);
    const now = metrics ? this.deps.clock.now() : 0;
    const wallNow = metrics ? this.deps.clock.epochMs() : 0;
    metrics?.recordAck(delivery.receivedAt, delivery.publishedAt, wallNow, now);
    if (delivery.refusal !== null) {
      // A part Redis refused counted nothing and has no marker; the others are
      // counted and marked. Dead-lettered, not acked: the replay (after the
      // key is repaired) counts the refused part once and skips the others by
      // their markers (within the marker TTL).
      // Some of its increments on other shards may stand (an undo Redis refused): the header keeps its replay back until they are subtracted.
      const headers = delivery.standing === undefined ? undefined : { [STANDING_COUNTS_HEADER]: JSON.stringify(delivery.standing) };
      this.deps.deadLetters.send(delivery.link, delivery.message, COUNT_REFUSED, `${COUNT_REFUSED}: ${delivery.refusal}`, delivery.traceparent, headers);
    } else if (delivery.position !== undefined) {
      // A stream: a part at or below its watermark was applied before (a replay after a restart, a handover or a rewind).
      counters.add(delivery.markedParts === 0 ? 'counted' : 'replayed');
    } else if (delivery.markedParts === delivery.parts) counters.add('duplicates');
    else if (delivery.markedParts === 0) {
      counters.add('counted');
      if (delivery.redelivered) counters.add('redelivered_unmarked');
    } else counters.add('partial_duplicates');
    if (delivery.refusal === null) acks.finish(delivery.link, delivery.tag);
    for (const waiter of delivery.waiters ?? []) {
      metrics?.recordAck(waiter.receivedAt, waiter.publishedAt, wallNow, now);
      counters.add('duplicates');
      this.exposure.occupied(waiter.link, waiter.tag, 1);
      acks.finish(waiter.link, waiter.tag);
    }
  }
}

/** Standing increments of a delivery's parts, summed by key (a delivery's parts may come back in several batches). */
function addStanding(into: Record<string, string> | undefined, more: Readonly<Record<string, string>>): Record<string, string> {
  const sum: Record<string, string> = { ...into };
  for (const [key, delta] of Object.entries(more)) sum[key] = (BigInt(sum[key] ?? '0') + BigInt(delta)).toString();
  return sum;
}

/** The x-tally-reason detail of a refused part: the Redis error, then where it happened. */
function describeCountRefusal(vshard: number, refusal: CountRefusal): string {
  const where = refusal.key === '' ? `shard ${vshard}` : `sku ${JSON.stringify(refusal.sku)}, key ${refusal.key}, delta ${refusal.delta}`;
  return `${refusal.error} (${where})`;
}
