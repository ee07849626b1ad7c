/**
 * Helpers of the tests that drive the CLI and the fleet: the CLI as a child
 * process, and waiting on a condition polled from outside the daemons.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { publishAll, type Publish, type PublishOptions } from '@tally/workload';
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

/** Messages per trickled chunk, and the pause between chunks: about 120 msg/s, so a last quarter of 3,000 lasts 25 s or more. */
const TRICKLE_SIZE = 12;
const TRICKLE_EVERY_MS = 100;

/**
 * Publishes a workload in the background while a test kills daemons on
 * progress (once a victim's heartbeat shows deliveries in its hands). Three
 * quarters go in paced slices; the last quarter is trickled for as long as
 * kills remain, which gives the kills 25 s or more beyond the paced part
 * (the four kills of a test take 5 to 20). A fixed pace was not enough: on
 * one CI run the restarts on a Redis Cluster outlasted it, and the last kill
 * waited two minutes for deliveries that never came.
 *
 * `killsOver()` sends the rest at once; `done` resolves with the count the
 * broker confirmed. `abort()`, for a test's `finally` before it deletes the
 * queue: publishing stops after the chunk in hand (a publisher left running
 * would declare the deleted queue again).
 */
export function publishDuringKills(
  publishes: readonly Publish[],
  options: PublishOptions,
  pace: { slices: number; pauseMs: number },
): { done: Promise<number>; killsOver: () => void; abort: () => Promise<void> } {
  let killing = true;
  let aborted = false;
  const paced = Math.floor(publishes.length * 0.75);
  const done = (async () => {
    let published = 0;
    const per = Math.ceil(paced / pace.slices);
    for (let s = 0; s < pace.slices && !aborted; s++) {
      published += await publishAll(publishes.slice(s * per, Math.min((s + 1) * per, paced)), options);
      await sleep(pace.pauseMs);
    }
    let at = paced;
    for (; killing && !aborted && at < publishes.length; at += TRICKLE_SIZE) {
      published += await publishAll(publishes.slice(at, at + TRICKLE_SIZE), options);
      await sleep(TRICKLE_EVERY_MS);
    }
    if (!aborted && at < publishes.length) published += await publishAll(publishes.slice(at), options);
    return published;
  })();
  // A test that fails before awaiting `done` must not leave its rejection unhandled.
  done.catch(() => {});
  return {
    done,
    killsOver: () => {
      killing = false;
    },
    abort: async () => {
      aborted = true;
      await done.catch(() => {});
    },
  };
}
