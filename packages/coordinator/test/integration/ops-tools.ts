/**
 * The operators' tools the ops tests drive: promtool and the prometheus
 * server (Debian package `prometheus`), systemd-analyze (package `systemd`).
 * CI installs them (scripts/lib.sh ensure_apt_packages); a missing one fails
 * the test with the package to install, never skips it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '@tally/testkit';

/** The repository root (tests run from packages/coordinator/dist/test/integration). */
export const REPO_ROOT = fileURLToPath(new URL('../../../../../', import.meta.url));
export const DEPLOY = join(REPO_ROOT, 'deploy');

export function requireTool(binary: string, aptPackage: string): string {
  for (const dir of (process.env.PATH ?? '').split(':').concat(['/usr/bin', '/usr/sbin', '/bin'])) {
    const candidate = join(dir, binary);
    if (dir !== '' && existsSync(candidate)) return candidate;
  }
  throw new Error(`${binary} not found: install the Debian package "${aptPackage}" (scripts/lib.sh ensure_apt_packages does it in CI)`);
}

export interface ToolRun {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a tool to completion; resolves with its exit code (-1 when killed) and output whatever the code. */
export function runTool(
  binary: string,
  args: readonly string[],
  options: { input?: string; cwd?: string; timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<ToolRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, args, { cwd: options.cwd, env: options.env ?? process.env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 120_000);
    child.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, stdout, stderr });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(options.input ?? '');
  });
}

export interface PrometheusServer {
  readonly url: string;
  readonly child: ChildProcess;
  readonly log: string[];
  /** Instant query through the HTTP API; throws with Prometheus' error text when it fails. */
  query(expr: string): Promise<Array<{ metric: Record<string, string>; value: [number, string] }>>;
  close(): Promise<void>;
}

/**
 * Debian's prometheus binary on a free loopback port, with its own config
 * and TSDB in a temporary directory: never the distro's service.
 */
export async function startPrometheus(
  targets: readonly string[],
  options: { scrapeIntervalS?: number; ruleFiles?: readonly string[] } = {},
): Promise<PrometheusServer> {
  const binary = requireTool('prometheus', 'prometheus');
  const dir = await mkdtemp(join(tmpdir(), 'tally-prom-'));
  const port = await freePort();
  const interval = `${options.scrapeIntervalS ?? 1}s`;
  const config = [
    'global:',
    `  scrape_interval: ${interval}`,
    `  evaluation_interval: ${interval}`,
    ...(options.ruleFiles?.length ? ['rule_files:', ...options.ruleFiles.map((f) => `  - ${JSON.stringify(f)}`)] : []),
    'scrape_configs:',
    '  - job_name: tally',
    '    static_configs:',
    `      - targets: [${targets.map((t) => JSON.stringify(t)).join(', ')}]`,
    '',
  ].join('\n');
  await writeFile(join(dir, 'prometheus.yml'), config);
  const child = spawn(
    binary,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      `--web.console.templates=${dir}`,
      `--web.console.libraries=${dir}`,
      '--log.level=warn',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const log: string[] = [];
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => log.push(chunk));
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => log.push(chunk));
  const url = `http://127.0.0.1:${port}`;
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const close = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    await rm(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) {
      await close();
      throw new Error(`prometheus exited with ${child.exitCode}: ${log.join('')}`);
    }
    try {
      if ((await fetch(`${url}/-/ready`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await close();
      throw new Error(`prometheus not ready within 30 s: ${log.join('')}`);
    }
    await sleep(200);
  }
  return {
    url,
    child,
    log,
    async query(expr) {
      const response = await fetch(`${url}/api/v1/query`, { method: 'POST', body: new URLSearchParams({ query: expr }) });
      const body = (await response.json()) as { status: string; error?: string; errorType?: string; data?: { resultType: string; result: unknown } };
      if (body.status !== 'success') throw new Error(`query ${JSON.stringify(expr)} failed: ${body.errorType}: ${body.error}`);
      const data = body.data!;
      if (data.resultType === 'scalar') {
        return [{ metric: {}, value: data.result as [number, string] }];
      }
      return data.result as Array<{ metric: Record<string, string>; value: [number, string] }>;
    },
    close,
  };
}
