/**
 * A batch across the thread boundary (the request and reply union around it
 * is thread-protocol.ts): one task per virtual-shard batch, one result back.
 * Every crossing has a fixed cost (a postMessage, a wake-up of the other
 * thread) that a batch pays once for all its messages, so nothing here is
 * ever sent per message (figures in docs/benchmark.md).
 */
import type { TallyMode } from './config.js';
import type { FailureClass } from './failure-class.js';
import { MARKER_DIGEST_BYTES, type DigestText, type MarkerScope } from './markers.js';
import type { PartChanges } from './shards.js';
import type { RedisTopology } from './redis-requirements.js';
import { decodePositions, type BatchPositions, type WatermarkReport } from './stream-positions.js';

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
  /** Filter bits per marker of the prefix's recorded format (filterBitsOfFormat); absent: by scope (markerFilterBits). */
  readonly markerFilterBits?: number;
  /**
   * The prefix's recorded marker scope (markers.ts). `message`: a task's
   * vshard is its messages' marker shard, and each change's count key is on
   * its own SKU's shard (of `virtualShards`); absent means `part`, where both
   * are the task's vshard.
   */
  readonly markerScope?: MarkerScope;
  /**
   * The prefix's format takes claims over by fenced adoption
   * (fencedAdoptionOf): every batch, of either mode, runs as two-step does
   * with message scope across slots, its claims naming the batch.
   */
  readonly fencedAdoption?: boolean;
  readonly virtualShards?: number;
  /** Two-step: this daemon's claim token (hex), the same in all its threads, new at every start. */
  readonly claimToken: string;
  /** Two-step: a claim older than this is taken over (its daemon died or stalled). */
  readonly claimTtlMs: number;
  /** Two-step: true claims new parts by native commands where safe (worker/src/native-claims.ts); absent or false, every claim by the claim script. */
  readonly nativeClaims?: boolean;
  /** Tests: shifts the threads' estimate of the server's clock, ms (native-claims.ts), to drive claims across a bucket boundary. */
  readonly nativeClaimSkewMs?: number;
  /**
   * TALLY_SOURCE: `stream` writes every batch with watermarks instead of
   * markers (stream-positions.ts, worker/src/stream-batch.ts), whatever
   * `mode` says; absent means `queue`.
   */
  readonly source?: 'queue' | 'stream';
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
  /**
   * Message id of each part, parallel to `changes`: only in tasks built by
   * tests. Ids do not cross the thread boundary (a log line names a part by
   * its digest, see partName); the marker work needs only the digests.
   */
  readonly ids?: readonly string[];
  /**
   * The marker digest of each part's message id (markers.ts), parallel to
   * `changes`: computed once per message by the coordinator. When absent
   * (tests build tasks from ids), the worker computes them.
   */
  readonly digests?: readonly Uint8Array[];
  readonly changes: readonly PartChanges[];
  /** Per part, its share of its message (1/parts), parallel to `changes`: what the window gauge weighs it by. */
  readonly shares?: Float64Array;
  /** W3C traceparent of the coordinator's `tally.batch` span, when tracing is on. */
  readonly traceparent?: string;
  /** Stream mode: each part's partition and offset, and the watermarks expected (stream-positions.ts). */
  readonly positions?: BatchPositions;
}

/** How a log line names part `index` of a task: its marker digest in hex (its message id in a task a test built from ids). */
export function partName(task: Pick<BatchTask, 'ids' | 'digests'>, index: number): string | undefined {
  const id = task.ids?.[index];
  if (id !== undefined) return id;
  const digest = task.digests?.[index];
  return digest === undefined ? undefined : Buffer.from(digest.buffer, digest.byteOffset, digest.byteLength).toString('hex');
}

/**
 * A BatchTask as it crosses the thread boundary: one ArrayBuffer, moved to
 * the thread in postMessage's transfer list (not cloned), plus three
 * primitives. Structured cloning walks every value of what it sends on the
 * main thread, which every delivery already passes through; a transferred
 * buffer is handed over whole, whatever it holds. Layout (little-endian, the
 * host's order: both ends are one process), sections in this order so every
 * typed view is aligned:
 *
 *   u32[4]   header: WIRE_VERSION, parts P, changes C, SKU bytes B
 *   u8[16P]  each part's marker digest (markers.ts)
 *   u32[P]   each part's message's part count (its share is 1/that)
 *   u32[P]   each part's change count
 *   f64[C]   each change's delta (a safe integer: message.ts)
 *   u32[C]   each change's SKU length in UTF-8 bytes
 *   u8[B]    the SKUs' UTF-8 bytes, back to back
 *
 * No message id travels: the markers need only the digest, and a log line
 * names a part by it.
 */
export interface WireBatchTask {
  readonly vshard: number;
  readonly batchId: string;
  /** Moved, not copied: detached on the sending side once posted (see transferListOf). */
  readonly buffer: ArrayBuffer;
  readonly traceparent?: string;
  /** Stream mode: stream-positions.ts's buffer, moved like `buffer`. */
  readonly positions?: ArrayBuffer;
}

/** Bumped when the layout above changes: a thread of another build refuses the task (a bug), never misreads it. */
const WIRE_VERSION = 0x7a11_0002;
const HEADER_BYTES = 16;

/** Where each section of the layout above starts, for P parts and C changes: the one place encoder and decoder agree on. */
function wireLayout(count: number, changes: number) {
  const digestsAt = HEADER_BYTES;
  const messagePartsAt = digestsAt + count * MARKER_DIGEST_BYTES;
  const changeCountsAt = messagePartsAt + count * 4;
  const deltasAt = changeCountsAt + count * 4;
  const skuLengthsAt = deltasAt + changes * 8;
  const skusAt = skuLengthsAt + changes * 4;
  return { digestsAt, messagePartsAt, changeCountsAt, deltasAt, skuLengthsAt, skusAt };
}

/** What postMessage must move instead of cloning: the task's buffer. */
export function transferListOf(wire: WireBatchTask): ArrayBuffer[] {
  return wire.positions === undefined ? [wire.buffer] : [wire.buffer, wire.positions];
}

/** The parts of a batch as the encoder reads them, by index: no object per part is made to hand them over. */
export interface WireParts {
  readonly count: number;
  /** The part's message's marker digest: bytes, or the coordinator's DigestText (markers.ts). */
  digest(index: number): Uint8Array | DigestText;
  changes(index: number): PartChanges;
  /** How many parts the part's message has (its share is 1/that); 1 for a message-scoped part. */
  messageParts(index: number): number;
}

/** Whether every character of `text` is ASCII (one UTF-8 byte each): the usual SKU, written without a native call. */
function isAscii(text: string): boolean {
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) > 0x7f) return false;
  return true;
}

/**
 * The encoder's scratch, reused by every batch (a thread encodes one batch
 * at a time: the function never yields). By flush time a batch's parts, their
 * deliveries, digests, change arrays and SKU strings are cold in memory; a
 * sizing pass before the writing pass walked them twice, and that walk was
 * most of the encoder's time in a profiled drain (line ticks: reading
 * `part[c][0]` and the ASCII check were 42 % of its 123 samples). One pass
 * fills these, then each section is copied into the buffer.
 */
const scratch = {
  digests: new Uint8Array(512 * MARKER_DIGEST_BYTES),
  messageParts: new Uint32Array(512),
  changeCounts: new Uint32Array(512),
  deltas: new Float64Array(1024),
  skus: [] as string[],
};

function ensureScratch(parts: number, changes: number): void {
  if (scratch.messageParts.length < parts) {
    const size = Math.max(parts, scratch.messageParts.length * 2);
    const digests = new Uint8Array(size * MARKER_DIGEST_BYTES);
    digests.set(scratch.digests);
    scratch.digests = digests;
    const messageParts = new Uint32Array(size);
    messageParts.set(scratch.messageParts);
    scratch.messageParts = messageParts;
    const changeCounts = new Uint32Array(size);
    changeCounts.set(scratch.changeCounts);
    scratch.changeCounts = changeCounts;
  }
  if (scratch.deltas.length < changes) {
    const deltas = new Float64Array(Math.max(changes, scratch.deltas.length * 2));
    deltas.set(scratch.deltas);
    scratch.deltas = deltas;
  }
}

/** Encodes a batch into one transferable buffer (layout above). */
export function encodeBatchTask(vshard: number, batchId: string, parts: WireParts, traceparent?: string, positions?: ArrayBuffer): WireBatchTask {
  const count = parts.count;
  ensureScratch(count, 0);
  const { skus } = scratch;
  let changes = 0;
  // The usual batch is ASCII SKUs only: their byte lengths are their lengths, and they are joined (a rope, no
  // copy) and written with one native call; writing them char by char cost about 0.1 µs per part (microbench).
  let allAscii = true;
  let joined = '';
  for (let i = 0; i < count; i++) {
    // 16 bytes: a loop is cheaper than TypedArray.prototype.set's call for so few.
    const digest = parts.digest(i);
    const digestAt = i * MARKER_DIGEST_BYTES;
    const digests = scratch.digests;
    if (typeof digest === 'string') for (let b = 0; b < MARKER_DIGEST_BYTES; b++) digests[digestAt + b] = digest.charCodeAt(b);
    else for (let b = 0; b < MARKER_DIGEST_BYTES; b++) digests[digestAt + b] = digest[b]!;
    scratch.messageParts[i] = parts.messageParts(i);
    const part = parts.changes(i);
    scratch.changeCounts[i] = part.length;
    ensureScratch(count, changes + part.length);
    const deltas = scratch.deltas;
    for (let c = 0; c < part.length; c++, changes++) {
      const entry = part[c]!;
      const sku = entry[0];
      deltas[changes] = entry[1];
      skus[changes] = sku;
      if (allAscii && !isAscii(sku)) allAscii = false;
      if (allAscii) joined += sku;
    }
  }
  let skuBytes = 0;
  if (allAscii) skuBytes = joined.length;
  else for (let c = 0; c < changes; c++) skuBytes += Buffer.byteLength(skus[c]!, 'utf8');

  const { digestsAt, messagePartsAt, changeCountsAt, deltasAt, skuLengthsAt, skusAt } = wireLayout(count, changes);
  const buffer = new ArrayBuffer(skusAt + skuBytes);
  const header = new Uint32Array(buffer, 0, 4);
  header[0] = WIRE_VERSION;
  header[1] = count;
  header[2] = changes;
  header[3] = skuBytes;
  const text = Buffer.from(buffer);
  text.set(scratch.digests.subarray(0, count * MARKER_DIGEST_BYTES), digestsAt);
  new Uint32Array(buffer, messagePartsAt, count).set(scratch.messageParts.subarray(0, count));
  new Uint32Array(buffer, changeCountsAt, count).set(scratch.changeCounts.subarray(0, count));
  new Float64Array(buffer, deltasAt, changes).set(scratch.deltas.subarray(0, changes));
  const skuLengths = new Uint32Array(buffer, skuLengthsAt, changes);
  if (allAscii) {
    for (let c = 0; c < changes; c++) skuLengths[c] = skus[c]!.length;
    text.write(joined, skusAt, 'latin1');
  } else
    for (let c = 0, at = skusAt; c < changes; c++) {
      const length = text.write(skus[c]!, at, 'utf8');
      skuLengths[c] = length;
      at += length;
    }
  // No SKU of this batch stays reachable from the scratch.
  skus.fill('', 0, changes);
  return { vshard, batchId, buffer, ...(traceparent === undefined ? {} : { traceparent }), ...(positions === undefined ? {} : { positions }) };
}

/** The inverse of encodeBatchTask, run in the worker thread. Throws on a malformed task (a bug, not input). */
export function decodeBatchTask(wire: WireBatchTask): BatchTask {
  const { buffer } = wire;
  if (!(buffer instanceof ArrayBuffer) || buffer.byteLength < HEADER_BYTES) throw new TypeError('malformed batch task: no buffer');
  const [version, count, changes, skuBytes] = new Uint32Array(buffer, 0, 4) as unknown as [number, number, number, number];
  if (version !== WIRE_VERSION) throw new TypeError(`malformed batch task: wire version ${version}, expected ${WIRE_VERSION}`);
  const { digestsAt, messagePartsAt, changeCountsAt, deltasAt, skuLengthsAt, skusAt } = wireLayout(count, changes);
  if (skusAt + skuBytes !== buffer.byteLength)
    throw new TypeError(`malformed batch task: ${buffer.byteLength} bytes for ${count} parts, ${changes} changes, ${skuBytes} SKU bytes`);
  const messageParts = new Uint32Array(buffer, messagePartsAt, count);
  const changeCounts = new Uint32Array(buffer, changeCountsAt, count);
  const deltas = new Float64Array(buffer, deltasAt, changes);
  const skuLengths = new Uint32Array(buffer, skuLengthsAt, changes);
  const text = Buffer.from(buffer);
  const digests: Buffer[] = new Array(count);
  const parts: PartChanges[] = new Array(count);
  const shares = new Float64Array(count);
  let change = 0;
  let at = skusAt;
  for (let i = 0; i < count; i++) {
    // A view, not a copy: ioredis sends it as the 16 bytes it covers.
    digests[i] = text.subarray(digestsAt + i * MARKER_DIGEST_BYTES, digestsAt + (i + 1) * MARKER_DIGEST_BYTES);
    shares[i] = 1 / messageParts[i]!;
    const length = changeCounts[i]!;
    if (change + length > changes) throw new TypeError(`malformed batch task at part ${i}: more changes than the header's ${changes}`);
    const part: PartChanges = new Array(length);
    for (let c = 0; c < length; c++, change++) {
      const end = at + skuLengths[change]!;
      part[c] = [text.toString('utf8', at, end), deltas[change]!];
      at = end;
    }
    parts[i] = part;
  }
  if (change !== changes || at !== buffer.byteLength) throw new TypeError(`malformed batch task: ${changes - change} changes left over`);
  return {
    vshard: wire.vshard,
    batchId: wire.batchId,
    digests,
    changes: parts,
    shares,
    ...(wire.traceparent === undefined ? {} : { traceparent: wire.traceparent }),
    ...(wire.positions === undefined ? {} : { positions: decodePositions(wire.positions, count) }),
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
  /**
   * Message-scoped markers on a Redis Cluster: this part's increments on
   * other count shards whose undo Redis refused (a key there changed since
   * the write), count key -> the delta that stands. Absent when all were
   * taken back (cross-slot-counts.ts). Its dead letter carries them
   * (STANDING_COUNTS_HEADER), so that a replay does not count them again.
   */
  readonly standing?: Readonly<Record<string, string>>;
}

export interface BatchResult {
  readonly vshard: number;
  /**
   * Per part: 0 new (counted now, or refused: see refusals), 1 its marker
   * was already occupied (a duplicate), 2 held: another daemon's live claim
   * has it (two-step), so nothing of it was counted and the coordinator runs
   * it again later. Stream mode: 0 applied now, 1 at or below the
   * watermark (applied before: a replay), 3 not applied because the
   * partition's watermark went backwards (PART_REWIND: replayed from the log).
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
  /** Two-step: new parts claimed by native commands rather than the claim script (worker/src/native-claims.ts). */
  readonly nativeClaims?: number;
  /** Fenced adoption: new parts another batch of their chain had counted on some count shard, not written again there. */
  readonly adoptedParts?: number;
  readonly timings: { readonly precheckMs: number; readonly writeMs: number; readonly occupyMs: number };
  /** Stream mode: per partition of the batch, its watermark on the batch's shard after it (stream-positions.ts). */
  readonly watermarks?: readonly WatermarkReport[];
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
  | { readonly kind: 'batch-done'; readonly result: BatchResult }
  | { readonly kind: 'batch-failed'; readonly failureClass: FailureClass; readonly message: string; readonly stack?: string };

const FAILURE_CLASSES: readonly string[] = ['transient', 'fatal', 'data', 'bug'];

/**
 * Whether a thread's answer has the shape of a BatchReply. The coordinator
 * checks before it trusts one: an answer of another shape (a thread built
 * from other sources, a protocol change on one side only) is a bug, not a
 * batch that may be retried (UnknownReplyError).
 */
export function isBatchReply(reply: unknown): reply is BatchReply {
  if (reply === null || typeof reply !== 'object') return false;
  const candidate = reply as { kind?: unknown; result?: unknown; failureClass?: unknown; message?: unknown; stack?: unknown };
  if (candidate.kind === 'batch-done') {
    const result = candidate.result as { marked?: unknown; refusals?: unknown } | null | undefined;
    return typeof result === 'object' && result !== null && result.marked instanceof Uint8Array && Array.isArray(result.refusals);
  }
  return (
    candidate.kind === 'batch-failed' &&
    typeof candidate.failureClass === 'string' &&
    FAILURE_CLASSES.includes(candidate.failureClass) &&
    typeof candidate.message === 'string' &&
    (candidate.stack === undefined || typeof candidate.stack === 'string')
  );
}
