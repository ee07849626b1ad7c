/**
 * The thread protocol between the coordinator and a worker thread: one task
 * per virtual-shard batch, one result back. Crossing threads costs about
 * 1 µs per message per batch against 12 µs per message one at a time, so
 * nothing here is ever sent per message.
 */
import type { TallyMode } from './config.js';
import { MARKER_DIGEST_BYTES } from './markers.js';
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
  /**
   * The marker digest of each part's message id (markers.ts), parallel to
   * `changes`; computed once per message by the coordinator. When absent
   * (tests), the worker computes them from `ids`.
   */
  readonly digests?: readonly Uint8Array[];
  /** Message id of each part, parallel to `changes`: only tests build tasks with ids and no digests; the wire carries digests only. */
  readonly ids?: readonly string[];
  readonly changes: readonly PartChanges[];
  /** W3C traceparent of the coordinator's `tally.batch` span, when tracing is on. */
  readonly traceparent?: string;
}

/**
 * A BatchTask as it crosses the thread boundary: one flat array of
 * primitives, `k, sku1, delta1, …, skuk, deltak` per part, and the parts'
 * marker digests back to back in one byte array (the ids themselves stay in
 * the coordinator: the threads only need their digests). Structured cloning
 * copies every nested array as an object; a flat array of strings and
 * numbers costs about a third, and one byte array for all the digests is
 * one copy, where a Buffer per part would be one object each. The main
 * thread is the one that pays.
 */
export interface WireBatchTask {
  readonly vshard: number;
  readonly parts: number;
  readonly flat: ReadonlyArray<string | number>;
  /** MARKER_DIGEST_BYTES per part, in part order. */
  readonly digests: Uint8Array;
  readonly traceparent?: string;
}

/** Flattens parts into a wire task; `partOf(i)` gives part i's message's marker digest and its changes. */
export function encodeBatchTask(
  vshard: number,
  parts: number,
  partOf: (index: number) => { readonly digest: Uint8Array; readonly changes: PartChanges },
  traceparent?: string,
): WireBatchTask {
  const flat: Array<string | number> = [];
  const digests = new Uint8Array(parts * MARKER_DIGEST_BYTES);
  for (let i = 0; i < parts; i++) {
    const { digest, changes } = partOf(i);
    flat.push(changes.length);
    for (const [sku, delta] of changes) flat.push(sku, delta);
    digests.set(digest, i * MARKER_DIGEST_BYTES);
  }
  return traceparent === undefined ? { vshard, parts, flat, digests } : { vshard, parts, flat, digests, traceparent };
}

/** The inverse of encodeBatchTask, run in the worker thread. Throws on a malformed task (a bug, not input). */
export function decodeBatchTask(wire: WireBatchTask): BatchTask {
  const changes: PartChanges[] = new Array(wire.parts);
  const digests: Buffer[] = new Array(wire.parts);
  const { flat } = wire;
  if (wire.digests.length !== wire.parts * MARKER_DIGEST_BYTES) throw new TypeError(`malformed batch task: ${wire.digests.length} digest bytes for ${wire.parts} parts`);
  let at = 0;
  for (let i = 0; i < wire.parts; i++) {
    const count = flat[at++];
    if (typeof count !== 'number') throw new TypeError(`malformed batch task at part ${i}`);
    const part: PartChanges = new Array(count);
    for (let c = 0; c < count; c++) part[c] = [flat[at++] as string, flat[at++] as number];
    changes[i] = part;
    // A view, not a copy: ioredis sends it as the 16 bytes it covers.
    digests[i] = Buffer.from(wire.digests.buffer, wire.digests.byteOffset + i * MARKER_DIGEST_BYTES, MARKER_DIGEST_BYTES);
  }
  if (at !== flat.length) throw new TypeError(`malformed batch task: ${flat.length - at} values left over`);
  const task = { vshard: wire.vshard, digests, changes };
  return wire.traceparent === undefined ? task : { ...task, traceparent: wire.traceparent };
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
