/**
 * The profile command: one drain of the bench workload by the real daemon
 * under `node --cpu-prof` (worker threads inherit the flag and write their
 * own profiles), then a self-time summary of every profile written.
 */
import { mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { benchContext } from './context.js';
import { isTally } from './contenders.js';
import { runDrain } from './drain.js';
import { workloadShape, type BenchOptions } from './options.js';
import { startPrivateRedis } from '@tally/testkit';
import { renderProfileSummary, summarizeProfile, type CpuProfile } from './profile-summary.js';
import { generateWorkload } from '@tally/workload';

/** `CPU.<date>.<time>.<pid>.<thread id>.<seq>.cpuprofile`: thread 0 is the main thread. */
export function threadOfProfile(file: string): string {
  const match = file.match(/^CPU\.\d+\.\d+\.(\d+)\.(\d+)\.\d+\.cpuprofile$/);
  if (!match) return file;
  return match[2] === '0' ? `main thread (pid ${match[1]})` : `worker thread ${match[2]} (pid ${match[1]})`;
}

export async function summarizeProfiles(dir: string, top = 15): Promise<string> {
  const files = (await readdir(dir)).filter((f) => f.endsWith('.cpuprofile')).sort();
  if (files.length === 0) return `no .cpuprofile files in ${dir}`;
  const parts: string[] = [];
  for (const file of files) {
    const profile = JSON.parse(await readFile(join(dir, file), 'utf8')) as CpuProfile;
    parts.push(renderProfileSummary(`${threadOfProfile(file)}: ${file}`, summarizeProfile(profile, top)));
  }
  return parts.join('\n\n');
}

export async function runProfile(options: BenchOptions, dir: string, log: (line: string) => void): Promise<number> {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const server = options.redisUrl === null ? await startPrivateRedis() : null;
  const redisUrl = options.redisUrl ?? server!.url;
  const redis = new Redis(redisUrl, { connectionName: 'tally-bench-profile' });
  try {
    const ctx = benchContext(options, {
      redisUrl,
      redisPrivate: server !== null,
      redis,
      runId: `prof${Date.now().toString(36)}`,
      // The profile run drains with the untraced daemon only.
      traceSinkUrl: 'http://127.0.0.1:4318',
      log,
    });
    const workload = generateWorkload({ ...workloadShape(options), idPrefix: 'prof' });
    // The first Tally contender asked for (--contenders tally-stream profiles a stream daemon), else two-step.
    const contender = options.contenders.find(isTally) ?? 'tally-two-step';
    const { record } = await runDrain(ctx, {
      contender,
      round: 0,
      label: 'profile',
      workload,
      nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${dir}`],
    });
    log(
      `profiled drain: ${record.messages} deliveries in ${record.seconds.toFixed(2)} s = ${Math.round(record.msgPerSec)} msg/s (profiler overhead included), cpu ${record.cpuSeconds.toFixed(2)} s, ${record.correct ? 'counted correctly' : `PROBLEM: ${record.problem}`}`,
    );
    log(await summarizeProfiles(dir));
    return record.correct ? 0 : 1;
  } finally {
    redis.disconnect();
    await server?.stop();
  }
}
