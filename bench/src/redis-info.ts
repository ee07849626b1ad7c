/** Pure readers of Redis INFO fields the bench measures (the INFO text itself is parsed by @tally/shared's parseInfo). */

/** INFO commandstats of one command: calls and microseconds spent in it (wall time inside each call). */
export interface CommandTime {
  readonly calls: number;
  readonly usec: number;
}

/** Calls and usec per command from INFO commandstats (`cmdstat_get:calls=3,usec=…`); a line without usec counts 0 µs. */
export function commandTimes(info: ReadonlyMap<string, string>): Map<string, CommandTime> {
  const times = new Map<string, CommandTime>();
  for (const [key, value] of info) {
    if (!key.startsWith('cmdstat_')) continue;
    const calls = value.match(/(?:^|,)calls=(\d+)/);
    const usec = value.match(/(?:^|,)usec=(\d+)/);
    if (calls) times.set(key.slice('cmdstat_'.length), { calls: Number(calls[1]), usec: usec ? Number(usec[1]) : 0 });
  }
  return times;
}

/** Calls per command from INFO commandstats. */
export function commandCalls(info: Map<string, string>): Map<string, number> {
  return new Map([...commandTimes(info)].map(([command, time]) => [command, time.calls]));
}

/** Microseconds per command from INFO commandstats: inside a script's call, what its own commands spent counts both in them and in EVALSHA. */
export function commandUsec(info: Map<string, string>): Map<string, number> {
  return new Map([...commandTimes(info)].map(([command, time]) => [command, time.usec]));
}

/** Error replies per error prefix from INFO errorstats (`errorstat_MOVED:count=3`): on a cluster, MOVED and ASK are redirects to another node. */
export function errorCounts(info: Map<string, string>): Map<string, number> {
  const counts = new Map<string, number>();
  for (const [key, value] of info) {
    if (!key.startsWith('errorstat_')) continue;
    const match = value.match(/(?:^|,)count=(\d+)/);
    if (match) counts.set(key.slice('errorstat_'.length), Number(match[1]));
  }
  return counts;
}

/** Per-command differences after - before, zero entries dropped. */
export function callsDelta(before: Map<string, number>, after: Map<string, number>): Map<string, number> {
  const delta = new Map<string, number>();
  for (const [command, calls] of after) {
    const d = calls - (before.get(command) ?? 0);
    if (d !== 0) delta.set(command, d);
  }
  return delta;
}

export function sumValues(map: Map<string, number>): number {
  let total = 0;
  for (const v of map.values()) total += v;
  return total;
}

/**
 * A numeric INFO field summed over several servers (a cluster's masters, or
 * its replicas). A server that lacks the field or holds a non-number makes
 * the sum NaN rather than a silent undercount.
 */
export function sumInfoField(infos: ReadonlyArray<Map<string, string>>, field: string): number {
  let total = 0;
  for (const info of infos) {
    const raw = info.get(field);
    const value = raw === undefined || raw.trim() === '' ? Number.NaN : Number(raw);
    total += value;
  }
  return total;
}

/** CPU seconds (user + system, main thread and children) a server has used so far: its `used_cpu_sys + used_cpu_user`, summed over servers. */
export function sumCpuSeconds(infos: ReadonlyArray<Map<string, string>>): number {
  return sumInfoField(infos, 'used_cpu_sys') + sumInfoField(infos, 'used_cpu_user');
}

/** Per-name counts of several servers (commandStat, errorCounts of each) added up per name. */
export function sumPerName(perServer: ReadonlyArray<Map<string, number>>): Map<string, number> {
  const total = new Map<string, number>();
  for (const counts of perServer) for (const [name, n] of counts) total.set(name, (total.get(name) ?? 0) + n);
  return total;
}

/** The keyspace of a server from MEMORY STATS (a flat name/value reply; `db.<n>` holds its own such list). */
export interface KeyspaceStats {
  readonly keys: number;
  /** The keyspace's own hash tables: overhead.hashtable.main + .expires (+ .slot-to-keys), every db. */
  readonly hashtableBytes: number;
  /** Part of hashtableBytes: on a cluster node (Redis 7.0) the two slot-list pointers of every key's dict entry. */
  readonly slotToKeysBytes: number;
}

function pairs(reply: unknown): Map<string, unknown> {
  const map = new Map<string, unknown>();
  if (!Array.isArray(reply)) return map;
  for (let i = 0; i + 1 < reply.length; i += 2) map.set(String(reply[i]), reply[i + 1]);
  return map;
}

export function keyspaceStats(memoryStats: unknown): KeyspaceStats {
  const top = pairs(memoryStats);
  let hashtableBytes = 0;
  let slotToKeysBytes = 0;
  for (const [name, value] of top) {
    if (!name.startsWith('db.')) continue;
    for (const [field, bytes] of pairs(value)) {
      if (!field.startsWith('overhead.hashtable.')) continue;
      hashtableBytes += Number(bytes);
      if (field === 'overhead.hashtable.slot-to-keys') slotToKeysBytes += Number(bytes);
    }
  }
  const keys = top.has('keys.count') ? Number(top.get('keys.count')) : Number.NaN;
  return { keys, hashtableBytes, slotToKeysBytes };
}

/** after[i] - before[i] for servers listed in the same order; NaN when the lists differ in length (a node came or went). */
export function perNodeDelta(before: readonly number[], after: readonly number[]): number[] {
  if (before.length !== after.length) return after.map(() => Number.NaN);
  return after.map((value, i) => value - before[i]!);
}
