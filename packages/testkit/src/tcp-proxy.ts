/**
 * A loopback TCP proxy a test or the bench controls, to cut or stall a real Redis
 * connection at a chosen moment (never a mock: the bytes go to the real server).
 */
import net from 'node:net';

export interface ProxyControl {
  readonly port: number;
  /** Called with each client->server chunk; return 'cut-after' to forward it and then drop the connection before the reply. */
  inspect: ((chunk: Buffer) => 'forward' | 'cut-after') | null;
  /** Drops every open connection. */
  cutAll(): void;
  /** Refuses new connections (and drops current ones) until resume(). */
  pause(): void;
  resume(): void;
  /** New connections go to another port from now on (a failover moved the service); current ones are left as they are. */
  retarget(port: number): void;
  /**
   * Holds what the server sends (the client hears nothing more, the server
   * believes it sent it) until release(); a cut or a dead server drops what
   * was held. `replication`: only on the connections of replicas (those that
   * sent PSYNC or SYNC), so a replica behind the proxy lags by exactly what
   * was held, whatever the kernel's socket buffers would have carried, while
   * the other clients of the server go on.
   */
  hold(which?: 'all' | 'replication'): void;
  release(): void;
  close(): Promise<void>;
}

export async function startProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<ProxyControl> {
  const sockets = new Set<net.Socket>();
  let paused = false;
  let holding: 'all' | 'replication' | null = null;
  /** Client sockets that opened a replication stream (PSYNC or SYNC). */
  const replicas = new WeakSet<net.Socket>();
  /** Server chunks held, each with the client it was meant for. */
  let held: Array<{ client: net.Socket; chunk: Buffer }> = [];
  const control: ProxyControl = {
    port: 0,
    inspect: null,
    cutAll() {
      for (const socket of sockets) socket.destroy();
      sockets.clear();
      held = [];
    },
    pause() {
      paused = true;
      control.cutAll();
    },
    resume() {
      paused = false;
    },
    retarget(port) {
      targetPort = port;
    },
    hold(which = 'all') {
      holding = which;
    },
    release() {
      holding = null;
      const pending = held;
      held = [];
      for (const { client, chunk } of pending) if (!client.destroyed) client.write(chunk);
    },
    close: () =>
      new Promise((resolve) => {
        control.cutAll();
        server.close(() => resolve());
      }),
  };
  const server = net.createServer((client) => {
    if (paused) {
      client.destroy();
      return;
    }
    const upstream = net.connect(targetPort, targetHost);
    sockets.add(client);
    sockets.add(upstream);
    const drop = () => {
      held = held.filter((entry) => entry.client !== client);
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    let cutting = false;
    client.on('data', (chunk: Buffer) => {
      if (/^(\*\d+\r\n\$\d+\r\n)?P?SYNC\b/i.test(chunk.toString('latin1', 0, 32))) replicas.add(client);
      const verdict = control.inspect?.(chunk) ?? 'forward';
      upstream.write(chunk);
      if (verdict === 'cut-after') {
        // Let the server receive the command, then cut before the reply returns.
        cutting = true;
        client.pause();
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      if (cutting) {
        drop();
        return;
      }
      if (holding === 'all' || (holding === 'replication' && replicas.has(client))) held.push({ client, chunk });
      else if (!client.destroyed) client.write(chunk);
    });
    client.on('error', drop);
    upstream.on('error', drop);
    client.on('close', drop);
    upstream.on('close', drop);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  (control as { port: number }).port = (server.address() as net.AddressInfo).port;
  return control;
}
