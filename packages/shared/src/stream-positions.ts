/**
 * Stream mode's part of a batch (TALLY_SOURCE=stream): where each part sits
 * in the log, and what the coordinator already knows of the shard's
 * watermarks. It travels beside the batch's buffer (batch-protocol.ts
 * WireBatchTask.positions), moved, not cloned, like it.
 *
 * A watermark is the highest offset of a partition whose parts on one
 * virtual shard are applied; it lives in the shard's hash, in the slot of
 * the shard's counts, and changes with them in one script
 * (worker/src/lua/stream_batch.lua). The batch carries, per partition, the
 * watermark this daemon last saw for the shard (`expected`, or -1 when it
 * has seen none): a watermark found below it went backwards, so Redis lost
 * writes it had acknowledged (a failover without WAIT, a restart without
 * AOF), and the partition is replayed from the log (invariant 18).
 *
 * Layout (little-endian), P parts, G partitions:
 *
 *   u32[2]   P, G
 *   u32[P]   each part's partition
 *   u32[G]   the batch's partitions, ascending
 *   f64[P]   each part's offset (an integer below 2^53)
 *   f64[G]   per partition, the expected watermark (-1: unknown)
 */

/** What the coordinator knows of one partition in a batch. */
export interface PartitionExpectation {
  readonly partition: number;
  /** The watermark this daemon last saw for (partition, shard); -1 when it has seen none. */
  readonly expected: number;
}

/** A batch's positions, decoded (in the worker thread). */
export interface BatchPositions {
  /** Per part, its partition. */
  readonly partitions: Uint32Array;
  /** Per part, its offset in its partition's stream. */
  readonly offsets: Float64Array;
  /** Per partition present in the batch, ascending: the watermark expected. */
  readonly expectations: readonly PartitionExpectation[];
}

/** The positions of a batch's parts as the encoder reads them, by index. */
export interface WirePositions {
  readonly count: number;
  partition(index: number): number;
  offset(index: number): number;
  /** The watermark this daemon last saw for the batch's shard and `partition`; -1 when none. */
  expected(partition: number): number;
}

/** Encodes a batch's positions into one transferable buffer (layout above). */
export function encodePositions(positions: WirePositions): ArrayBuffer {
  const count = positions.count;
  const present = new Set<number>();
  for (let i = 0; i < count; i++) present.add(positions.partition(i));
  const partitions = [...present].sort((a, b) => a - b);
  const groups = partitions.length;
  const u32Bytes = 4 * (2 + count + groups);
  // f64 sections start 8-aligned.
  const f64At = u32Bytes + (u32Bytes % 8);
  const buffer = new ArrayBuffer(f64At + 8 * (count + groups));
  const u32 = new Uint32Array(buffer, 0, 2 + count + groups);
  const f64 = new Float64Array(buffer, f64At, count + groups);
  u32[0] = count;
  u32[1] = groups;
  for (let i = 0; i < count; i++) {
    u32[2 + i] = positions.partition(i);
    f64[i] = positions.offset(i);
  }
  for (let g = 0; g < groups; g++) {
    const partition = partitions[g]!;
    u32[2 + count + g] = partition;
    f64[count + g] = positions.expected(partition);
  }
  return buffer;
}

/** The inverse of encodePositions, run in the worker thread; `parts` is the batch's part count. Throws on a malformed buffer (a bug). */
export function decodePositions(buffer: ArrayBuffer, parts: number): BatchPositions {
  if (!(buffer instanceof ArrayBuffer) || buffer.byteLength < 8) throw new TypeError('malformed batch positions: no buffer');
  const [count, groups] = new Uint32Array(buffer, 0, 2) as unknown as [number, number];
  if (count !== parts) throw new TypeError(`malformed batch positions: ${count} positions for ${parts} parts`);
  const u32Bytes = 4 * (2 + count + groups);
  const f64At = u32Bytes + (u32Bytes % 8);
  if (buffer.byteLength !== f64At + 8 * (count + groups))
    throw new TypeError(`malformed batch positions: ${buffer.byteLength} bytes for ${count} parts, ${groups} partitions`);
  const u32 = new Uint32Array(buffer, 0, 2 + count + groups);
  const f64 = new Float64Array(buffer, f64At, count + groups);
  const expectations: PartitionExpectation[] = [];
  for (let g = 0; g < groups; g++) expectations.push({ partition: u32[2 + count + g]!, expected: f64[count + g]! });
  return { partitions: u32.subarray(2, 2 + count), offsets: f64.subarray(0, count), expectations };
}

/**
 * What a stream batch did to one partition's watermark on the batch's shard
 * (BatchResult.watermarks): `offset` is the watermark after the batch (the
 * batch's highest applied offset, or the one found when nothing was applied).
 * `rolledBack` when the watermark found was below the one expected: nothing
 * of that partition was applied (its parts are PART_REWIND), and the
 * coordinator replays the partition from `offset` + 1.
 */
export interface WatermarkReport {
  readonly partition: number;
  readonly offset: number;
  readonly expected: number;
  readonly rolledBack: boolean;
}
