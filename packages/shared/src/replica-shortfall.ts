/**
 * An unmeetable WAIT (TALLY_REDIS_WAIT_REPLICAS = N), decided from what each
 * master says of its replicas. Pure: the coordinator's replica watch
 * (coordinator/src/redis/replica-watch.ts) reads `INFO replication` and the slot
 * map, this decides and words it.
 *
 * A master with fewer than N replicas able to acknowledge cannot answer a
 * WAIT N, however long the batch waits: every batch of the virtual shards it
 * holds times out and is retried, never acked (replica-wait.ts), until a
 * replica comes back or the daemon is restarted with a lower N. The typical
 * case is a Redis Cluster master SIGKILLed and not brought back: its promoted
 * replica serves its slots with no replica of its own.
 *
 * Only replicas in `state=online` count: one still in its initial sync
 * (wait_bgsave, send_bulk) acknowledges nothing yet. A replica that is
 * connected but stopped (SIGSTOP, a frozen VM) still counts: the master
 * cannot tell it from a slow one until repl-timeout; the WAIT timeouts
 * (tally_wait_timeouts_total and the stall) show that case.
 */
import { parseInfo } from './redis-requirements.js';

/** What `INFO replication` of one server says. */
export interface ReplicationInfo {
  readonly role: 'master' | 'replica' | 'unknown';
  /** `connected_slaves`. */
  readonly connectedReplicas: number;
  /** The `slave<n>:` lines with `state=online`: the replicas a WAIT can count on. */
  readonly onlineReplicas: number;
}

export function replicationFromInfo(info: string): ReplicationInfo {
  const fields = parseInfo(info);
  const role = fields.get('role');
  const connected = Number(fields.get('connected_slaves') ?? '0');
  let online = 0;
  for (const [key, value] of fields) if (/^slave\d+$/.test(key) && /(^|,)state=online(,|$)/.test(value)) online++;
  return {
    role: role === 'master' ? 'master' : role === 'slave' ? 'replica' : 'unknown',
    connectedReplicas: Number.isInteger(connected) && connected > 0 ? connected : 0,
    onlineReplicas: online,
  };
}

/** A master that cannot meet the WAIT, and the virtual shards whose batches wait on it. */
export interface ShortMaster {
  /** host:port, as the client reaches it: never credentials. */
  readonly address: string;
  readonly replicas: number;
  readonly wanted: number;
  /** Ascending. */
  readonly shards: readonly number[];
}

/**
 * The masters with fewer than `wanted` online replicas, each with the shards
 * it holds. `owners[vshard]` is the address of the master serving that
 * shard's slot (undefined when unknown); `replicas` maps an address to its
 * online replicas, or null when it could not be asked (an outage, reported
 * elsewhere): such a master keeps what `before` said of it, so a passing
 * timeout neither raises nor clears the condition. Sorted by address.
 */
export function findShortMasters(
  wanted: number,
  owners: readonly (string | undefined)[],
  replicas: ReadonlyMap<string, number | null>,
  before: readonly ShortMaster[] = [],
): ShortMaster[] {
  if (wanted <= 0) return [];
  const shardsOf = new Map<string, number[]>();
  owners.forEach((address, shard) => {
    if (address === undefined) return;
    const list = shardsOf.get(address);
    if (list === undefined) shardsOf.set(address, [shard]);
    else list.push(shard);
  });
  const previous = new Map(before.map((master) => [master.address, master]));
  const short: ShortMaster[] = [];
  for (const [address, shards] of shardsOf) {
    const known = replicas.get(address);
    const count = known === undefined || known === null ? (previous.get(address)?.replicas ?? null) : known;
    if (count === null || count >= wanted) continue;
    short.push({ address, replicas: count, wanted, shards });
  }
  return short.sort((a, b) => a.address.localeCompare(b.address));
}

/** What changed between two checks: masters newly short, and masters no longer short (or no longer holding a shard). */
export function shortfallChanges(before: readonly ShortMaster[], after: readonly ShortMaster[]): { started: ShortMaster[]; cleared: ShortMaster[] } {
  const was = new Set(before.map((master) => master.address));
  const is = new Set(after.map((master) => master.address));
  return { started: after.filter((master) => !was.has(master.address)), cleared: before.filter((master) => !is.has(master.address)) };
}

/** `0-3, 7, 9-12`: ascending shards as ranges. */
export function describeShards(shards: readonly number[]): string {
  const sorted = [...new Set(shards)].sort((a, b) => a - b);
  const ranges: string[] = [];
  for (let i = 0; i < sorted.length;) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j]! + 1) j++;
    ranges.push(i === j ? String(sorted[i]) : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return ranges.join(', ');
}

/** One line naming the master, its shards and the fix: /readyz's reason and the log line. */
export function describeShortMaster(master: ShortMaster): string {
  const plural = (n: number, word: string): string => `${n} ${word}${n === 1 ? '' : 's'}`;
  return (
    `redis WAIT for ${plural(master.wanted, 'replica')} cannot be met: master ${master.address} has ${plural(master.replicas, 'online replica')} ` +
    `(virtual shards ${describeShards(master.shards)}: their batches wait unacked); ` +
    'bring a replica of it back, or lower TALLY_REDIS_WAIT_REPLICAS and restart'
  );
}
