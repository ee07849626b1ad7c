/**
 * What the run-time tests read from outside the daemon: /readyz, /metrics,
 * the broker's own count of unacked deliveries, and counts in a private Redis.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { readCounts } from '../../src/commands/counts.js';

const run = promisify(execFile);

export interface ReadyzBody {
  readonly ready: boolean;
  readonly reason: string | null;
  readonly since: string | null;
  readonly [key: string]: unknown;
}

export async function readyz(port: number): Promise<{ code: number; body: ReadyzBody }> {
  const response = await fetch(`http://127.0.0.1:${port}/readyz`);
  return { code: response.status, body: (await response.json()) as ReadyzBody };
}

export async function metricsText(port: number): Promise<string> {
  return (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
}

/** The value of the first sample of `name` whose labels include every `labels` pair; null when absent. */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number | null {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (!Object.entries(labels).every(([key, value]) => line.includes(`${key}="${value}"`))) continue;
    return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return null;
}

/** The broker's view of a queue: ready and unacknowledged messages. */
export async function brokerQueue(queue: string): Promise<{ ready: number; unacked: number }> {
  const { stdout } = await run('rabbitmqctl', ['list_queues', '-q', '--no-table-headers', 'name', 'messages_ready', 'messages_unacknowledged'], {
    timeout: 30_000,
  });
  for (const line of stdout.split('\n')) {
    const [name, ready, unacked] = line.trim().split(/\s+/);
    if (name === queue) return { ready: Number(ready), unacked: Number(unacked) };
  }
  throw new Error(`queue ${queue} not listed by rabbitmqctl`);
}

export async function waitFor<T>(what: string, probe: () => Promise<T | null | undefined | false>, timeoutMs = 60_000, everyMs = 200): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown = null;
  for (;;) {
    try {
      const value = await probe();
      if (value !== null && value !== undefined && value !== false) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await sleep(everyMs);
  }
}

/** Every count under the prefix in the Redis at `url`. */
export async function countsAt(url: string, prefix: string, virtualShards = 16): Promise<Map<string, number>> {
  const redis = new Redis(url, { maxRetriesPerRequest: 0 });
  redis.on('error', () => {});
  try {
    const raw = await readCounts(redis, { prefix, virtualShards }, []);
    return new Map([...raw].map(([sku, value]) => [sku, Number(value)]));
  } finally {
    redis.disconnect();
  }
}
