/**
 * Free loopback ports for the servers a test starts.
 */
import { createServer } from 'node:net';

/**
 * A loopback port nobody listens on right now. The OS picks it; between our
 * close and the caller's listen another process could take it, so callers
 * that spawn servers treat a bind failure as "try another port".
 */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** `count` distinct free ports. */
export async function freePorts(count: number): Promise<number[]> {
  const ports = new Set<number>();
  while (ports.size < count) ports.add(await freePort());
  return [...ports];
}
