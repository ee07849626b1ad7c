/**
 * The thread protocol between the coordinator and a worker thread: one task
 * per virtual-shard batch, one result back. Every crossing has a fixed cost
 * (a postMessage, a structured clone, a wake-up of the other thread) that a
 * batch pays once for all its messages, so nothing here is ever sent per
 * message (figures in docs/benchmark.md).
 */
import type { TallyMode } from './config.js';
import type { FailureClass } from './failure-class.js';
import { MARKER_DIGEST_BYTES, type MarkerScope } from './markers.js';
import type { PartChanges } from './shards.js';
import type { RedisTopology } from './redis-requirements.js';

/** Fixed for the life of a thread: passed as piscina's workerData. */
export interface WorkerSettings {
  readonly redisUrl: string;
  /** Detected once by the daemon's probe; absent means standalone. */
  readonly redisTopology?: RedisTopology;
  readonly prefix: string;
  readonly mode: TallyMode;
  readonly markerTtlS: number;
  readonly countTtlS: number;
  readonly logLevel: string;
  /** Two-step mode: the WindowGauge's buffer, shared with the coordinator's exposure meter. */
  readonly windowGauge?: SharedArrayBuffer;
  /** TALLY_REDIS_WAIT_REPLICAS: a batch returns only once this many replicas acknowledged its writes (WAIT); 0: no WAIT. */
  readonly waitReplicas: number;
  /** TALLY_REDIS_WAIT_TIMEOUT_MS: one WAIT's timeout; a timeout is retried, never ignored. */
  readonly waitTimeoutMs: number;
  /** The prefix's marker bucket width and initial sub-bucket count, as recorded in its layout (markers.ts). */
  readonly markerBucketS: number;
  readonly markerSubBuckets: number;
  /**
   * The prefix's recorded marker scope (markers.ts). `message`: a task's
   * vshard is its messages' marker shard, and each change's count key is on
   * its own SKU's shard (of `virtualShards`); absent means `part`, where both
   * are the task's vshard.
   */
  readonly markerScope?: MarkerScope;
  readonly virtualShards?: number;
  /** Two-step: this daemon's claim token (hex), the same in all its threads, new at every start. */
  readonly claimToken: string;
  /** Two-step: a claim older than this is taken over (its daemon died or stalled). */
  readonly claimTtlMs: number;
}

export interface BatchTask {
  readonly vshard: number;
  /**
   * Made by the coordinator, once per batch, and the same on every run of it
   * (invariant 12): the write receipt is keyed by it, so a rerun after a lost
   * reply, a dead thread or an outage finds the receipt its first run left and
   * writes nothing twice. An id made inside the worker would be new on every
   * rerun, and a thread that died between the count write and the markers
   * would have its counts written twice.
   */
  readonly batchId: string;
  /** Message id of each part, parallel to `changes`. */
  readonly ids: readonly string[];
  /**
   * The marker digest of each part's message id (markers.ts), parallel to
   * `ids`: computed once per message by the coordinator. When absent (tests
   * build tasks from ids), the worker computes them.
   */
  readonly digests?: readonly Uint8Array[];
  readonly changes: readonly PartChanges[];
  /** Per part, its share of its message (1/parts), parallel to `ids`: what the window gauge weighs it by. */
  readonly shares?: Float64Array;
  /** W3C traceparent of the coordinator's `tally.batch` span, when tracing is on. */
  readonly traceparent?: string;
}

/**
 * A BatchTask as it crosses the thread boundary: one flat array of
 * primitives, `id, k, sku1, delta1, …, skuk, deltak` per part, and the
 * parts' marker digests back to back in one byte array. Structured cloning
 * copies every nested array as an object; a flat array of strings and
 * numbers is far cheaper to clone, and one byte array for all the digests is
 * one copy where a Buffer per part would be one object each. The main
 * thread, which every delivery already passes through, is the one that pays
 * (docs/benchmark.md).
 */
export interface WireBatchTask {
  readonly vshard: number;
  readonly batchId: string;
  readonly parts: number;
  readonly flat: ReadonlyArray<string | number>;
  /** MARKER_DIGEST_BYTES per part, in part order. */
  readonly digests: Uint8Array;
  readonly shares?: Float64Array;
  readonly traceparent?: string;
}

/** Flattens parts into a wire task; `partOf(i)` gives part i's id, its message's marker digest and its changes. */
export function encodeBatchTask(
  vshard: number,
  batchId: string,
  parts: number,
  partOf: (index: number) => { readonly id: string; readonly digest: Uint8Array; readonly changes: PartChanges },
  traceparent?: string,
  shares?: Float64Array,
): WireBatchTask {
  const flat: Array<string | number> = [];
  const digests = new Uint8Array(parts * MARKER_DIGEST_BYTES);
  for (let i = 0; i < parts; i++) {
    const { id, digest, changes } = partOf(i);
    flat.push(id, changes.length);
    for (const [sku, delta] of changes) flat.push(sku, delta);
    digests.set(digest, i * MARKER_DIGEST_BYTES);
  }
  return {
    vshard,
    batchId,
    parts,
    flat,
    digests,
    ...(shares === undefined ? {} : { shares }),
    ...(traceparent === undefined ? {} : { traceparent }),
  };
}

/** The inverse of encodeBatchTask, run in the worker thread. Throws on a malformed task (a bug, not input). */
export function decodeBatchTask(wire: WireBatchTask): BatchTask {
  const ids: string[] = new Array(wire.parts);
  const changes: PartChanges[] = new Array(wire.parts);
  const digests: Buffer[] = new Array(wire.parts);
  const { flat } = wire;
  if (wire.digests.length !== wire.parts * MARKER_DIGEST_BYTES)
    throw new TypeError(`malformed batch task: ${wire.digests.length} digest bytes for ${wire.parts} parts`);
  let at = 0;
  for (let i = 0; i < wire.parts; i++) {
    const id = flat[at++];
    const count = flat[at++];
    if (typeof id !== 'string' || typeof count !== 'number') throw new TypeError(`malformed batch task at part ${i}`);
    const part: PartChanges = new Array(count);
    for (let c = 0; c < count; c++) part[c] = [flat[at++] as string, flat[at++] as number];
    ids[i] = id;
    changes[i] = part;
    // A view, not a copy: ioredis sends it as the 16 bytes it covers.
    digests[i] = Buffer.from(wire.digests.buffer, wire.digests.byteOffset + i * MARKER_DIGEST_BYTES, MARKER_DIGEST_BYTES);
  }
  if (at !== flat.length) throw new TypeError(`malformed batch task: ${flat.length - at} values left over`);
  if (wire.shares !== undefined && wire.shares.length !== wire.parts)
    throw new TypeError(`malformed batch task: ${wire.shares.length} shares for ${wire.parts} parts`);
  const { vshard, batchId } = wire;
  return {
    vshard,
    batchId,
    ids,
    digests,
    changes,
    ...(wire.shares === undefined ? {} : { shares: wire.shares }),
    ...(wire.traceparent === undefined ? {} : { traceparent: wire.traceparent }),
  };
}

/**
 * A part Redis refused to count (a foreign value in a count key, a 64-bit
 * overflow): it counted nothing and occupies no marker, so its message is
 * dead-lettered (`count-refused`) and a replay after the key is repaired
 * counts it once.
 */
export interface CountRefusal {
  /** The part's index in the batch. */
  readonly part: number;
  /** The count key Redis refused (the first one in the part); '' when the whole part was refused before any key. */
  readonly key: string;
  readonly sku: string;
  /** The refused increment, as a decimal string. */
  readonly delta: string;
  /** Redis's error reply. */
  readonly error: string;
}

export interface BatchResult {
  readonly vshard: number;
  /**
   * Per part: 0 new (counted now, or refused: see refusals), 1 its marker
   * was already occupied (a duplicate), 2 held: another daemon's live claim
   * has it (two-step), so nothing of it was counted and the coordinator runs
   * it again later.
   */
  readonly marked: Uint8Array;
  /** Count writes that failed and were retried. */
  readonly writeRetries: number;
  /** 1 if occupying the markers failed at least once after the counts were written. */
  readonly occupationFailures: number;
  /** WAITs that timed out before enough replicas acknowledged the batch's writes (each was retried). */
  readonly waitTimeouts: number;
  /** Parts Redis refused to count; each counted nothing and has no marker. */
  readonly refusals: readonly CountRefusal[];
  /** Two-step: parts claimed over another daemon's expired claim (it died or stalled). */
  readonly claimTakeovers: number;
  readonly timings: { readonly precheckMs: number; readonly writeMs: number; readonly occupyMs: number };
}

/**
 * What a worker thread answers for a task. A failure travels as data, with
 * its class decided in the thread: an error thrown across the thread
 * boundary arrives as a plain Error (a Redis ReplyError loses its name), and
 * the coordinator must still tell a `data` failure (isolate the parts and
 * dead-letter them) from a `transient` one (retry), a `fatal` one (retry
 * visibly) and a `bug` (stop the process: exit 70, ack nothing more).
 * `stack` is the original error's, sent for a `bug` so that the one fatal
 * line names where in the thread it happened.
 */
export type BatchReply =
  | { readonly ok: true; readonly result: BatchResult }
  | { readonly ok: false; readonly failureClass: FailureClass; readonly message: string; readonly stack?: string };

const FAILURE_CLASSES: readonly string[] = ['transient', 'fatal', 'data', 'bug'];

/**
 * Whether a thread's answer has the shape of a BatchReply. The coordinator
 * checks before it trusts one: an answer of another shape (a thread built
 * from other sources, a protocol change on one side only) is a bug, not a
 * batch that may be retried (UnknownReplyError).
 */
export function isBatchReply(reply: unknown): reply is BatchReply {
  if (reply === null || typeof reply !== 'object') return false;
  const candidate = reply as { ok?: unknown; result?: unknown; failureClass?: unknown; message?: unknown; stack?: unknown };
  if (candidate.ok === true) {
    const result = candidate.result as { marked?: unknown; refusals?: unknown } | null | undefined;
    return typeof result === 'object' && result !== null && result.marked instanceof Uint8Array && Array.isArray(result.refusals);
  }
  return (
    candidate.ok === false &&
    typeof candidate.failureClass === 'string' &&
    FAILURE_CLASSES.includes(candidate.failureClass) &&
    typeof candidate.message === 'string' &&
    (candidate.stack === undefined || typeof candidate.stack === 'string')
  );
}

/**
 * What a worker thread posts to the coordinator while a batch is still
 * running (piscina's 'message' event), so a stall shows before the batch ends.
 */
export type ThreadEvent = { readonly type: 'wait-timeout'; readonly vshard: number; readonly acked: number; readonly wanted: number };
