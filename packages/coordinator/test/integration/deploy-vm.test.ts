import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, realpath, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { loadConfig } from '@tally/shared';
import { cleanup, compare, countsOf, testSpace, waitForReadyEmpty, AMQP_URL } from './harness.js';
import { DEPLOY, REPO_ROOT, requireTool, runTool } from './ops-tools.js';

const UNIT = join(DEPLOY, 'systemd', 'tally.service');
const ENV_EXAMPLE = join(DEPLOY, 'systemd', 'tally.env.example');

/** `Key=value` lines of one section of a unit file (comments and blanks skipped). */
function section(unit: string, name: string): Map<string, string> {
  const keys = new Map<string, string>();
  let current = '';
  for (const raw of unit.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const header = /^\[(.+)\]$/.exec(line);
    if (header) {
      current = header[1]!;
      continue;
    }
    if (current !== name) continue;
    const eq = line.indexOf('=');
    keys.set(line.slice(0, eq), line.slice(eq + 1));
  }
  return keys;
}

function envFile(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of text.split('\n')) {
    const match = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(line.trim());
    if (match) env[match[1]!] = match[2]!;
  }
  return env;
}

function seconds(value: string): number {
  const match = /^(\d+)(s|min)?$/.exec(value);
  if (!match) throw new Error(`unexpected time span ${value}`);
  return Number(match[1]) * (match[2] === 'min' ? 60 : 1);
}

describe('deploy/systemd and the VM install (integration)', function () {
  this.timeout(300_000);

  it('the unit runs as a dedicated user, restarts on failure, stops with SIGTERM after the grace, and is hardened', async () => {
    const unit = await readFile(UNIT, 'utf8');
    const service = section(unit, 'Service');
    expect(service.get('User')).to.equal('tally');
    expect(service.get('Group')).to.equal('tally');
    expect(service.get('Restart')).to.equal('on-failure');
    expect(service.get('KillSignal')).to.equal('SIGTERM');
    expect(service.get('EnvironmentFile')).to.equal('/etc/tally/tally.env');
    expect(Number(service.get('LimitNOFILE'))).to.be.at.least(65_536);
    for (const [key, value] of Object.entries({
      NoNewPrivileges: 'yes',
      ProtectSystem: 'strict',
      ProtectHome: 'yes',
      PrivateTmp: 'yes',
      PrivateDevices: 'yes',
      RestrictSUIDSGID: 'yes',
      CapabilityBoundingSet: '',
    })) {
      expect(service.get(key), key).to.equal(value);
    }
    // The example configuration is valid as it stands, and its grace fits inside the stop timeout with a margin.
    const env = envFile(await readFile(ENV_EXAMPLE, 'utf8'));
    const config = loadConfig(env);
    expect(config.shutdownGraceMs).to.equal(30_000);
    expect(seconds(service.get('TimeoutStopSec')!) * 1000, 'TimeoutStopSec > TALLY_SHUTDOWN_GRACE_MS + 5 s').to.be.greaterThan(config.shutdownGraceMs + 5_000);
  });

  it("passes systemd-analyze verify (ExecStart pointed at this machine's node and the built daemon), and fails a broken one", async () => {
    const analyze = requireTool('systemd-analyze', 'systemd');
    const dir = await mkdtemp(join(tmpdir(), 'tally-unit-'));
    try {
      const unit = await readFile(UNIT, 'utf8');
      // Only the paths change: every other line is verified as shipped.
      const local = unit
        .replace(
          'ExecStart=/usr/bin/node /opt/tally/dist/src/main.js',
          `ExecStart=${process.execPath} ${join(REPO_ROOT, 'packages/coordinator/dist/src/main.js')}`,
        )
        .replace('WorkingDirectory=/opt/tally', `WorkingDirectory=${REPO_ROOT}`);
      expect(local.split('\n').filter((line, i) => line !== unit.split('\n')[i])).to.have.length(2);
      await writeFile(join(dir, 'tally.service'), local);
      const run = await runTool(analyze, ['verify', join(dir, 'tally.service')]);
      expect(run.stdout + run.stderr, 'no warning').to.equal('');
      expect(run.code).to.equal(0);

      await writeFile(
        join(dir, 'broken.service'),
        local.replace(`ExecStart=${process.execPath}`, 'ExecStart=/nonexistent/node').replace('KillSignal=SIGTERM', 'KillSignal=SIGBOGUS'),
      );
      const broken = await runTool(analyze, ['verify', join(dir, 'broken.service')]);
      expect(broken.code).to.not.equal(0);
      expect(broken.stdout + broken.stderr).to.match(/not executable|SIGBOGUS/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('pnpm deploy --prod makes a self-contained folder; the daemon runs from it, outside the workspace, and consumes', async () => {
    const pnpm = requireTool('pnpm', 'pnpm (scripts/lib.sh ensure_pnpm)');
    const target = join(await mkdtemp(join(tmpdir(), 'tally-vm-')), 'tally');
    const space = testSpace('deploy', { TALLY_BATCH_WAIT_MS: '10' });
    try {
      const deploy = await runTool(pnpm, ['--filter', '@tally/coordinator', 'deploy', '--prod', target], { cwd: REPO_ROOT, timeoutMs: 240_000 });
      expect(deploy.code, deploy.stdout + deploy.stderr).to.equal(0);
      for (const dependency of ['@tally/shared', '@tally/worker']) {
        const real = await realpath(join(target, 'node_modules', dependency));
        expect(real.startsWith(await realpath(target)), `${dependency} is copied in, not linked to the workspace (${real})`).to.equal(true);
      }
      expect(existsSync(join(target, 'node_modules', 'mocha')), 'no dev dependency').to.equal(false);

      const workload = generateWorkload({ messages: 500, skus: 40, seed: 8, duplicateRate: 0.05, idPrefix: space.queue });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      const child = spawn(process.execPath, [join(target, 'dist/src/main.js')], {
        cwd: target,
        env: { PATH: process.env.PATH, ...space.env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
      child.stderr.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
      const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
      try {
        await waitForReadyEmpty(space.queue, 60_000);
        const deadline = Date.now() + 30_000;
        while (!compare(await countsOf(space.prefix), workload.truth).exact && Date.now() < deadline) await sleep(200);
      } finally {
        child.kill('SIGTERM');
      }
      expect(await exited, output).to.equal(0);
      expect(output).to.include('"msg":"consuming"');
      expect(compare(await countsOf(space.prefix), workload.truth).exact, 'the deployed daemon counted everything exactly').to.equal(true);
      // The deployed CLI too.
      const stats = await runTool(process.execPath, [join(target, 'dist/src/cli.js'), 'stats', '--json'], {
        cwd: target,
        env: { PATH: process.env.PATH, ...space.env },
      });
      expect(stats.code, stats.stderr).to.equal(0);
      expect((JSON.parse(stats.stdout) as { counted: number }).counted).to.equal(workload.good);
    } finally {
      await rm(join(target, '..'), { recursive: true, force: true });
      await cleanup(space);
    }
  });
});
