/**
 * Waits until a MONITOR connection has shown everything Redis ran before
 * now: sends `GET <fence key>` and resolves when MONITOR shows it (MONITOR
 * streams commands in the order Redis ran them). A fixed pause instead was
 * a race once other suites loaded the shared Redis alongside.
 */
import type { Redis } from 'ioredis';

export async function monitorFence(monitor: Redis, client: Redis, fenceKey: string, timeoutMs = 10_000): Promise<void> {
  let onMonitor: ((time: string, args: string[]) => void) | undefined;
  const seen = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`MONITOR did not show GET ${fenceKey} within ${timeoutMs} ms`)), timeoutMs);
    onMonitor = (_time, args) => {
      if (args[0]?.toLowerCase() === 'get' && args[1] === fenceKey) {
        clearTimeout(timer);
        resolve();
      }
    };
    monitor.on('monitor', onMonitor);
  });
  try {
    await client.get(fenceKey);
    await seen;
  } finally {
    monitor.off('monitor', onMonitor!);
  }
}
