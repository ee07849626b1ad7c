/**
 * A stand-in for Jaeger's OTLP/HTTP receiver on loopback: it accepts trace
 * exports and counts them, so the traced contender pays the real cost of
 * building, serialising and sending every span.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface TraceSink {
  readonly url: string;
  readonly requests: () => number;
  readonly bytes: () => number;
  close(): Promise<void>;
}

export async function startTraceSink(): Promise<TraceSink> {
  let requests = 0;
  let bytes = 0;
  const server = createServer((request, response) => {
    request.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
    });
    request.on('end', () => {
      requests++;
      response.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests: () => requests,
    bytes: () => bytes,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
