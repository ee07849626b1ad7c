/**
 * The Redis Cluster hash slot of a key (https://redis.io/docs/reference/cluster-spec/#key-distribution-model):
 * CRC16 (XMODEM) of the key, or of its hash tag, the text between the first
 * `{` and the next `}` when that text is not empty, modulo 16384.
 *
 * Tally tags every key of a virtual shard `{<vshard>}` (shared/src/keys.ts),
 * so all of a shard batch's keys share one slot; this tells which one, and so
 * which master serves it (redis-connection.ts, masterForKey).
 */

export const CLUSTER_SLOT_COUNT = 16_384;

const TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    table[i] = crc;
  }
  return table;
})();

/** CRC16-XMODEM (polynomial 0x1021, initial 0), as Redis Cluster computes it. */
export function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ byte) & 0xff]!;
  return crc;
}

/** The part of a key that is hashed: its hash tag when it has a non-empty one, else the whole key. */
export function hashedPart(key: string): string {
  const open = key.indexOf('{');
  if (open < 0) return key;
  const close = key.indexOf('}', open + 1);
  if (close < 0 || close === open + 1) return key;
  return key.slice(open + 1, close);
}

export function keySlot(key: string): number {
  return crc16(Buffer.from(hashedPart(key), 'utf8')) % CLUSTER_SLOT_COUNT;
}
