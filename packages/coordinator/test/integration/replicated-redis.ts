/**
 * A private master and one replica (`redis-server --replicaof`), for the
 * WAIT tests and the failover scenario: SIGSTOP the replica to stall
 * replication, SIGKILL the master and promote the replica for a failover.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { startPrivateRedis, type PrivateRedis } from '@tally/testkit';
import { readStats } from '../../src/commands/stats.js';

export interface ReplicatedRedis {
  readonly master: PrivateRedis;
  readonly replica: PrivateRedis;
  stop(): Promise<void>;
}

export async function startReplicatedRedis(masterArgs: readonly string[] = []): Promise<ReplicatedRedis> {
  const master = await startPrivateRedis({ args: masterArgs });
  const replica = await startPrivateRedis({ args: ['--replicaof', '127.0.0.1', String(master.port)] });
  await waitForLink(replica.url);
  return {
    master,
    replica,
    async stop() {
      for (const server of [replica, master]) {
        try {
          process.kill(server.pid, 'SIGCONT');
        } catch {
          // already gone
        }
        await server.stop();
      }
    },
  };
}

/** Waits until the replica's link to its master is up and the initial sync done. */
export async function waitForLink(replicaUrl: string, timeoutMs = 20_000): Promise<void> {
  const redis = new Redis(replicaUrl);
  try {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const info = await redis.info('replication');
      if (/master_link_status:up/.test(info) && /master_sync_in_progress:0/.test(info)) return;
      await sleep(50);
    }
    throw new Error(`replica ${replicaUrl} did not sync within ${timeoutMs} ms`);
  } finally {
    redis.disconnect();
  }
}

export async function statsAt(url: string, prefix: string): Promise<Awaited<ReturnType<typeof readStats>>> {
  const redis = new Redis(url);
  try {
    return await readStats(redis, { prefix });
  } finally {
    redis.disconnect();
  }
}

const run = promisify(execFile);

/** The broker's count of delivered-but-unacked messages of a queue. */
export async function unackedOf(queue: string): Promise<number> {
  const { stdout } = await run('rabbitmqctl', ['list_queues', '-q', '--no-table-headers', 'name', 'messages_unacknowledged'], { timeout: 60_000 });
  for (const line of stdout.split('\n')) {
    const [name, unacked] = line.trim().split(/\s+/);
    if (name === queue) return Number(unacked);
  }
  throw new Error(`queue ${queue} not listed by rabbitmqctl`);
}
