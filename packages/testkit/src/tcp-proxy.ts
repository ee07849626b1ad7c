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
  close(): Promise<void>;
}

export async function startProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<ProxyControl> {
  const sockets = new Set<net.Socket>();
  let paused = false;
  const control: ProxyControl = {
    port: 0,
    inspect: null,
    cutAll() {
      for (const socket of sockets) socket.destroy();
      sockets.clear();
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
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    let cutting = false;
    client.on('data', (chunk: Buffer) => {
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
      if (!client.destroyed) client.write(chunk);
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
