/**
 * Helpers of the tests that drive the CLI and the fleet: the CLI as a child
 * process, and waiting on a condition polled from outside the daemons.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { CLI } from './harness.js';

const run = promisify(execFile);

/** Runs `tally <args>` to its exit (killed after 2 minutes, so a retry loop fails the test): its output and exit code. */
export async function tallyCli(env: Record<string, string>, ...args: string[]): Promise<{ stdout: string; stderr: string; code: number }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [CLI, ...args], { env: { ...process.env, ...env }, timeout: 120_000 });
    return { stdout, stderr, code: 0 };
  } catch (error) {
    const e = error as { stdout: string; stderr: string; code: number };
    return { stdout: e.stdout, stderr: e.stderr, code: e.code };
  }
}

/** Polls `probe` until it returns a value that is not undefined; throws naming `what` after the timeout. */
export async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000, everyMs = 200): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}
