/**
 * CPU time and peak memory of a child process, read from /proc (Linux).
 * The parsers are pure; the readers are the thin I/O around them.
 * /proc/<pid>/stat of the main thread sums every thread of the process, so
 * the daemon's worker threads are included; /proc/<pid>/task/<pid>/stat is
 * the main thread alone.
 */
import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';

export interface CpuTicks {
  readonly utime: number;
  readonly stime: number;
}

/** utime and stime (fields 14 and 15) of a /proc/<pid>/stat line; the name field may hold spaces and parentheses. */
export function parseProcStat(text: string): CpuTicks {
  const close = text.lastIndexOf(')');
  if (close < 0) throw new Error('not a /proc/<pid>/stat line');
  // After "pid (comm) " the fields start at field 3 (state).
  const fields = text
    .slice(close + 2)
    .trim()
    .split(/\s+/);
  const utime = Number(fields[14 - 3]);
  const stime = Number(fields[15 - 3]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime)) throw new Error('unparseable /proc/<pid>/stat line');
  return { utime, stime };
}

/** A field of /proc/<pid>/status in bytes (the kernel writes kB), e.g. VmHWM (peak resident set). */
export function parseStatusBytes(text: string, field: string): number {
  const match = text.match(new RegExp(`^${field}:\\s+(\\d+)\\s+kB`, 'm'));
  if (!match) throw new Error(`no ${field} in /proc/<pid>/status`);
  return Number(match[1]) * 1024;
}

let ticksPerSecond: number | null = null;
function clockTicks(): number {
  if (ticksPerSecond === null) {
    try {
      ticksPerSecond = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

/** CPU seconds (user + system, all threads) a process has used so far. */
export async function cpuSeconds(pid: number): Promise<number> {
  const { utime, stime } = parseProcStat(await readFile(`/proc/${pid}/stat`, 'utf8'));
  return (utime + stime) / clockTicks();
}

/** Peak resident set size of a process, in bytes. */
export async function peakRssBytes(pid: number): Promise<number> {
  return parseStatusBytes(await readFile(`/proc/${pid}/status`, 'utf8'), 'VmHWM');
}

/** CPU seconds (user + system) one thread of a process has used so far: the main thread's tid is the pid. */
export async function threadCpuSeconds(pid: number, tid: number = pid): Promise<number> {
  const { utime, stime } = parseProcStat(await readFile(`/proc/${pid}/task/${tid}/stat`, 'utf8'));
  return (utime + stime) / clockTicks();
}
