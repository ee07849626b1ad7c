/**
 * Pure: the figures of `pnpm bench --natural-check`, which asks whether the
 * steady-state fill (marker-fill.ts) stands in for a natural steady state.
 * The same sustained load runs twice on one private Redis: once after the
 * daemon itself wrote the marker population (a natural run of two marker
 * TTLs), once after the fill wrote it. Each run's window is measured from
 * counters sampled at its start and its end: the daemon's messages, batches
 * and CPU, the server's CPU, its per-command time (INFO commandstats) and
 * its expiry work (INFO stats). Per message, side by side, they say where a
 * difference between the two goes.
 */
import type { CommandTime } from './redis-info.js';

/** Counters read at one instant of a run. */
export interface RunCounters {
  /** performance.now() when read. */
  readonly atMs: number;
  /** tally_received_total. */
  readonly messages: number;
  /** tally_batch_size_count and _sum: shard batches and their parts. */
  readonly batches: number;
  readonly batchParts: number;
  /** The daemon's process CPU (user + system, every thread). */
  readonly daemonCpuS: number;
  /** The server's used_cpu_sys + used_cpu_user. */
  readonly redisCpuS: number;
  readonly commands: ReadonlyMap<string, CommandTime>;
  /** INFO stats: keys expired, and milliseconds of the active expire cycle. */
  readonly expiredKeys: number;
  readonly expireCycleMs: number;
}

export interface WindowFigures {
  readonly seconds: number;
  readonly messages: number;
  readonly msgPerSec: number;
  readonly partsPerBatch: number;
  readonly daemonCpuUsPerMsg: number;
  readonly redisCpuUsPerMsg: number;
  /**
   * Microseconds per message inside commands, by command (commandstats
   * usec), largest first. A command a script calls is counted both in its
   * own line and in the script's (EVALSHA).
   */
  readonly commandUsPerMsg: ReadonlyArray<readonly [string, number]>;
  /** Commands per message, those scripts call included. */
  readonly commandsPerMsg: number;
  /** Server CPU outside scripts (EVAL, EVALSHA): networking, the event loop, commands sent as such, expiry, lazy frees. */
  readonly outsideScriptsUsPerMsg: number;
  readonly expiredKeysPerMsg: number;
  readonly expireCycleUsPerMsg: number;
}

/** The commands that run a script: the commands it calls are counted inside their time. */
const SCRIPT_COMMANDS = new Set(['eval', 'evalsha', 'eval_ro', 'evalsha_ro', 'fcall', 'fcall_ro']);

/** What happened between two readings of one run, per message. */
export function windowFigures(start: RunCounters, end: RunCounters): WindowFigures {
  const messages = end.messages - start.messages;
  if (!(messages > 0)) throw new RangeError(`the window saw no message (${start.messages} → ${end.messages})`);
  const perMsg = (d: number) => d / messages;
  const seconds = (end.atMs - start.atMs) / 1000;
  let scriptUsec = 0;
  let calls = 0;
  const byCommand: Array<[string, number]> = [];
  for (const [name, after] of end.commands) {
    const before = start.commands.get(name) ?? { calls: 0, usec: 0 };
    const usec = after.usec - before.usec;
    calls += after.calls - before.calls;
    if (SCRIPT_COMMANDS.has(name)) scriptUsec += usec;
    if (usec > 0) byCommand.push([name, usec / messages]);
  }
  byCommand.sort((a, b) => b[1] - a[1]);
  const redisCpuUs = (end.redisCpuS - start.redisCpuS) * 1e6;
  const batches = end.batches - start.batches;
  return {
    seconds,
    messages,
    msgPerSec: messages / seconds,
    partsPerBatch: batches > 0 ? (end.batchParts - start.batchParts) / batches : Number.NaN,
    daemonCpuUsPerMsg: perMsg((end.daemonCpuS - start.daemonCpuS) * 1e6),
    redisCpuUsPerMsg: perMsg(redisCpuUs),
    commandUsPerMsg: byCommand,
    commandsPerMsg: perMsg(calls),
    outsideScriptsUsPerMsg: perMsg(redisCpuUs - scriptUsec),
    expiredKeysPerMsg: perMsg(end.expiredKeys - start.expiredKeys),
    expireCycleUsPerMsg: perMsg((end.expireCycleMs - start.expireCycleMs) * 1000),
  };
}

export interface Held {
  readonly markers: number;
  readonly receipts: number;
}

export interface NaturalCheckRecord {
  readonly rate: number;
  readonly markerTtlS: number;
  readonly windowS: number;
  /** Markers and write receipts each run's prefix held when its window opened. */
  readonly natural: Held;
  readonly filled: Held;
  readonly naturalWindow: WindowFigures;
  readonly filledWindow: WindowFigures;
  readonly problems: readonly string[];
}

const f1 = (n: number) => (Number.isFinite(n) ? n.toFixed(1) : 'n/a');
const f2 = (n: number) => (Number.isFinite(n) ? n.toFixed(2) : 'n/a');
const ratio = (a: number, b: number) => (b > 0 && Number.isFinite(a) ? (a / b).toFixed(2) : 'n/a');

/** The two windows side by side, with the commands that took the most of either. */
export function renderNaturalCheck(record: NaturalCheckRecord, topCommands = 6): string {
  const { naturalWindow: n, filledWindow: f } = record;
  const held = (h: Held) => `${h.markers.toLocaleString('en')} markers and ${h.receipts.toLocaleString('en')} write receipts`;
  const rows: Array<[string, number, number, (x: number) => string]> = [
    ['msg/s in the window', n.msgPerSec, f.msgPerSec, (x) => Math.round(x).toLocaleString('en')],
    ['parts per shard batch', n.partsPerBatch, f.partsPerBatch, f1],
    ['daemon CPU µs / msg', n.daemonCpuUsPerMsg, f.daemonCpuUsPerMsg, f1],
    ['Redis CPU µs / msg', n.redisCpuUsPerMsg, f.redisCpuUsPerMsg, f1],
    ['  outside scripts', n.outsideScriptsUsPerMsg, f.outsideScriptsUsPerMsg, f1],
    ['  active expire cycle', n.expireCycleUsPerMsg, f.expireCycleUsPerMsg, f2],
  ];
  const names = new Set([...n.commandUsPerMsg.slice(0, topCommands), ...f.commandUsPerMsg.slice(0, topCommands)].map(([name]) => name));
  const usOf = (w: WindowFigures, name: string) => w.commandUsPerMsg.find(([c]) => c === name)?.[1] ?? 0;
  // A script's commands are inside its time too: the lines below overlap.
  for (const name of names)
    rows.push([`  in ${name.toUpperCase()}${SCRIPT_COMMANDS.has(name) ? '' : ' (from scripts too)'}`, usOf(n, name), usOf(f, name), f2]);
  rows.push(['Redis commands / msg', n.commandsPerMsg, f.commandsPerMsg, f2]);
  rows.push(['keys expired / msg', n.expiredKeysPerMsg, f.expiredKeysPerMsg, (x) => x.toFixed(4)]);
  const lines = [
    `Natural steady state against the fill: ${record.rate.toLocaleString('en')} msg/s, marker TTL ${record.markerTtlS} s, ` +
      `windows of ${record.windowS} s. When its window opened, the natural run's prefix held ${held(record.natural)}; ` +
      `the filled one's, ${held(record.filled)}.`,
    '',
    '| per message | natural | after the fill | fill ÷ natural |',
    '|---|---:|---:|---:|',
    ...rows.map(([label, a, b, fmt]) => `| ${label} | ${fmt(a)} | ${fmt(b)} | ${ratio(b, a)} |`),
  ];
  for (const problem of record.problems) lines.push('', `PROBLEM: ${problem}`);
  return lines.join('\n');
}
