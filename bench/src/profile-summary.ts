/**
 * Pure: turns a V8 .cpuprofile (what `node --cpu-prof` writes, one file per
 * thread) into the functions with the most self time, and the same grouped
 * by source file or package. No I/O; the bench's `profile` command reads
 * the files and prints these.
 */

export interface CpuProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number; readonly columnNumber?: number };
  readonly hitCount?: number;
  readonly children?: readonly number[];
}

export interface CpuProfile {
  readonly nodes: readonly CpuProfileNode[];
  readonly startTime: number;
  readonly endTime: number;
  readonly samples?: readonly number[];
  readonly timeDeltas?: readonly number[];
}

export interface SelfTimeRow {
  readonly name: string;
  readonly where: string;
  readonly selfMs: number;
  /** Share of the busy time (everything but `(idle)`), in percent. */
  readonly percentOfBusy: number;
}

export interface ProfileSummary {
  readonly wallMs: number;
  readonly busyMs: number;
  readonly idleMs: number;
  readonly functions: readonly SelfTimeRow[];
  readonly files: readonly SelfTimeRow[];
}

/** Shortens a script URL to what tells you whose code it is: the package and file. */
export function shortWhere(url: string): string {
  if (url === '') return '(native)';
  const path = url.replace(/^file:\/\//, '');
  const modules = path.lastIndexOf('/node_modules/');
  if (modules >= 0) {
    const rest = path.slice(modules + '/node_modules/'.length).replace(/^\.pnpm\/[^/]+\/node_modules\//, '');
    return rest;
  }
  const packages = path.match(/\/(packages\/[^/]+\/.*|bench\/.*)$/);
  if (packages) return packages[1]!;
  return path.startsWith('node:') ? path : path.split('/').slice(-2).join('/');
}

function byDescendingSelf(a: SelfTimeRow, b: SelfTimeRow): number {
  return b.selfMs - a.selfMs || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
}

/**
 * Self time per node from the sample stream (timeDeltas[i] is the time
 * before sample i, in microseconds); falls back to hitCount when a profile
 * has no samples, weighting each hit by the mean interval.
 */
function selfMicros(profile: CpuProfile): Map<number, number> {
  const self = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  if (samples.length > 0) {
    // V8 attributes delta i+1 to sample i: the time until the next sample.
    for (let i = 0; i < samples.length; i++) {
      const next = deltas[i + 1];
      const micros = next !== undefined && next >= 0 ? next : 0;
      self.set(samples[i]!, (self.get(samples[i]!) ?? 0) + micros);
    }
    return self;
  }
  const hits = profile.nodes.reduce((sum, n) => sum + (n.hitCount ?? 0), 0);
  const interval = hits > 0 ? (profile.endTime - profile.startTime) / hits : 0;
  for (const node of profile.nodes) self.set(node.id, (node.hitCount ?? 0) * interval);
  return self;
}

export function summarizeProfile(profile: CpuProfile, top = 15): ProfileSummary {
  const self = selfMicros(profile);
  const functions = new Map<string, { name: string; where: string; micros: number }>();
  const files = new Map<string, number>();
  let idle = 0;
  let total = 0;
  for (const node of profile.nodes) {
    const micros = self.get(node.id) ?? 0;
    if (micros === 0) continue;
    total += micros;
    const { functionName, url, lineNumber } = node.callFrame;
    if (functionName === '(idle)') {
      idle += micros;
      continue;
    }
    const name = functionName === '' ? '(anonymous)' : functionName;
    const where = url === '' ? '(native)' : `${shortWhere(url)}:${lineNumber + 1}`;
    const key = `${name}@${where}`;
    const entry = functions.get(key) ?? { name, where, micros: 0 };
    entry.micros += micros;
    functions.set(key, entry);
    const file = url === '' ? (name.startsWith('(') ? name : '(native)') : shortWhere(url);
    files.set(file, (files.get(file) ?? 0) + micros);
  }
  const busy = total - idle;
  const row = (name: string, where: string, micros: number): SelfTimeRow => ({
    name,
    where,
    selfMs: micros / 1000,
    percentOfBusy: busy > 0 ? (100 * micros) / busy : 0,
  });
  return {
    wallMs: (profile.endTime - profile.startTime) / 1000,
    busyMs: busy / 1000,
    idleMs: idle / 1000,
    functions: [...functions.values()]
      .map((f) => row(f.name, f.where, f.micros))
      .sort(byDescendingSelf)
      .slice(0, top),
    files: [...files.entries()]
      .map(([file, micros]) => row(file, '', micros))
      .sort(byDescendingSelf)
      .slice(0, top),
  };
}

/** A plain-text report of one thread's profile. */
export function renderProfileSummary(label: string, summary: ProfileSummary): string {
  const lines = [
    `${label}: wall ${summary.wallMs.toFixed(0)} ms, busy ${summary.busyMs.toFixed(0)} ms, idle ${summary.idleMs.toFixed(0)} ms`,
    '  top self time (functions):',
    ...summary.functions.map((f) => `    ${f.percentOfBusy.toFixed(1).padStart(5)}%  ${f.selfMs.toFixed(0).padStart(6)} ms  ${f.name}  ${f.where}`),
    '  by file / package:',
    ...summary.files.map((f) => `    ${f.percentOfBusy.toFixed(1).padStart(5)}%  ${f.selfMs.toFixed(0).padStart(6)} ms  ${f.name}`),
  ];
  return lines.join('\n');
}
