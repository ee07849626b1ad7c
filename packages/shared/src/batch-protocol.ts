/**
 * The thread protocol between the coordinator and a worker thread: one task
 * per virtual-shard batch, one result back. Crossing threads costs about
 * 1 µs per message per batch against 12 µs per message one at a time, so
 * nothing here is ever sent per message.
 */
import type { TallyMode } from './config.js';
import type { PartChanges } from './shards.js';

/** Fixed for the life of a thread: passed as piscina's workerData. */
export interface WorkerSettings {
  readonly redisUrl: string;
  readonly prefix: string;
  readonly mode: TallyMode;
  readonly markerTtlS: number;
  readonly countTtlS: number;
  readonly logLevel: string;
  /** The prefix's marker bucket width and initial sub-bucket count, as recorded in its layout (markers.ts). */
  readonly markerBucketS: number;
  readonly markerSubBuckets: number;
  /** Two-step: this daemon's claim token (hex), the same in all its threads, new at every start. */
  readonly claimToken: string;
  /** Two-step: a claim older than this is taken over (its daemon died or stalled). */
  readonly claimTtlMs: number;
}

export interface BatchTask {
  readonly vshard: number;
  /** Message id of each part, parallel to `changes`. */
  readonly ids: readonly string[];
  readonly changes: readonly PartChanges[];
  /** W3C traceparent of the coordinator's `tally.batch` span, when tracing is on. */
  readonly traceparent?: string;
}

/**
 * A BatchTask as it crosses the thread boundary: one flat array of
 * primitives, `id, k, sku1, delta1, …, skuk, deltak` per part. Structured
 * cloning copies every nested array as an object; a flat array of strings
 * and numbers costs about a third, and the main thread is the one that pays.
 */
export interface WireBatchTask {
  readonly vshard: number;
  readonly parts: number;
  readonly flat: ReadonlyArray<string | number>;
  readonly traceparent?: string;
}

/** Flattens parts into a wire task; `partOf(i)` gives part i's id and changes. */
export function encodeBatchTask(
  vshard: number,
  parts: number,
  partOf: (index: number) => { readonly id: string; readonly changes: PartChanges },
  traceparent?: string,
): WireBatchTask {
  const flat: Array<string | number> = [];
  for (let i = 0; i < parts; i++) {
    const { id, changes } = partOf(i);
    flat.push(id, changes.length);
    for (const [sku, delta] of changes) flat.push(sku, delta);
  }
  return traceparent === undefined ? { vshard, parts, flat } : { vshard, parts, flat, traceparent };
}

/** The inverse of encodeBatchTask, run in the worker thread. Throws on a malformed task (a bug, not input). */
export function decodeBatchTask(wire: WireBatchTask): BatchTask {
  const ids: string[] = new Array(wire.parts);
  const changes: PartChanges[] = new Array(wire.parts);
  const { flat } = wire;
  let at = 0;
  for (let i = 0; i < wire.parts; i++) {
    const id = flat[at++];
    const count = flat[at++];
    if (typeof id !== 'string' || typeof count !== 'number') throw new TypeError(`malformed batch task at part ${i}`);
    const part: PartChanges = new Array(count);
    for (let c = 0; c < count; c++) part[c] = [flat[at++] as string, flat[at++] as number];
    ids[i] = id;
    changes[i] = part;
  }
  if (at !== flat.length) throw new TypeError(`malformed batch task: ${flat.length - at} values left over`);
  return wire.traceparent === undefined ? { vshard: wire.vshard, ids, changes } : { vshard: wire.vshard, ids, changes, traceparent: wire.traceparent };
}

export interface BatchResult {
  readonly vshard: number;
  /**
   * Per part: 0 new (counted now), 1 its marker was already occupied (a
   * duplicate), 2 held: another daemon's live claim has it (two-step), so
   * nothing of it was counted and the coordinator runs it again later.
   */
  readonly marked: Uint8Array;
  /** Count writes that failed and were retried. */
  readonly writeRetries: number;
  /** 1 if occupying the markers failed at least once after the counts were written. */
  readonly occupationFailures: number;
  /** Count increments Redis refused. */
  readonly countErrors: number;
  /** Two-step: parts claimed over another daemon's expired claim (it died or stalled). */
  readonly claimTakeovers: number;
  readonly timings: { readonly precheckMs: number; readonly writeMs: number; readonly occupyMs: number };
}
