/**
 * What one shard batch came to, told once, in one place, to everything that
 * watches batches: its span ends, the batch histograms record it, the
 * exposure meter learns its parts are marked (or that it was given up), and
 * the counters of invariant 9 add what the thread reported. The deliveries
 * themselves are settlement.ts's.
 */
import type { Span } from '@opentelemetry/api';
import { PART_HELD, type BatchResult } from '@tally/shared';
import { endBatchSpan } from '../telemetry/batch-span.js';
import type { Counters, Exposure, PipelineMetrics } from './ports.js';
import type { PendingPart } from './shard-lanes.js';

/** One batch's end: its result, or null when it was given up because the threads stopped. */
export interface BatchOutcome {
  readonly vshard: number;
  readonly parts: readonly PendingPart[];
  readonly result: BatchResult | null;
  readonly elapsedMs: number;
  readonly span: Span;
}

export interface BatchObserver {
  batchSettled(outcome: BatchOutcome): void;
}

export interface BatchObserverDeps {
  readonly counters: Counters;
  readonly exposure: Exposure;
  readonly metrics: PipelineMetrics | null;
}

/** The daemon's observers of a batch, in the order they must hear of it (the meter before any delivery is settled). */
export function batchObserver({ counters, exposure, metrics }: BatchObserverDeps): BatchObserver {
  return {
    batchSettled({ vshard, parts, result, elapsedMs, span }) {
      exposure.batchReturned(vshard);
      if (result === null) {
        span.end();
        return;
      }
      endBatchSpan(span, result);
      metrics?.recordBatch(parts.length, elapsedMs, result);
      counters.add('occupation_failures', result.occupationFailures);
      counters.add('write_retries', result.writeRetries);
      counters.add('count_errors', result.refusals.length);
      counters.add('claim_takeovers', result.claimTakeovers);
      counters.add('adopted', result.adoptedParts ?? 0);
      counters.add('native_claims', result.nativeClaims ?? 0);
      // A part held by another daemon's claim is not marked yet: it is run again, and told then.
      exposure.batchDone(parts.filter((_, i) => result.marked[i] !== PART_HELD).map((part) => part.delivery));
    },
  };
}
