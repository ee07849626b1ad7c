/** Pure readers of Redis INFO fields the bench measures (the INFO text itself is parsed by @tally/shared's parseInfo). */

/** Calls per command from INFO commandstats (`cmdstat_get:calls=3,usec=…`). */
export function commandCalls(info: Map<string, string>): Map<string, number> {
  const calls = new Map<string, number>();
  for (const [key, value] of info) {
    if (!key.startsWith('cmdstat_')) continue;
    const match = value.match(/(?:^|,)calls=(\d+)/);
    if (match) calls.set(key.slice('cmdstat_'.length), Number(match[1]));
  }
  return calls;
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
