/**
 * The daemon's HTTP endpoint on TALLY_METRICS_HOST:TALLY_METRICS_PORT
 * (loopback by default: metrics and readiness say a lot about the system, so
 * exposing them is an operator's choice, e.g. TALLY_METRICS_HOST=0.0.0.0):
 *   /metrics  Prometheus text format
 *   /healthz  200 while the process lives
 *   /readyz   200 while running, consuming, connected, Redis accepting writes and no
 *             delivery stalled; else 503 with `reason` and `since` (readiness.ts)
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { PrometheusExporter } from '@opentelemetry/exporter-prometheus';

export interface Readiness {
  readonly ready: boolean;
  readonly detail: Record<string, unknown>;
}

export class HttpEndpoints {
  private server: Server | null = null;

  constructor(
    private readonly exporter: PrometheusExporter,
    private readonly readiness: () => Readiness,
  ) {}

  /** Listens on `host`:`port` (0 picks a free port) and resolves with the port in use. */
  listen(port: number, host: string): Promise<number> {
    const server = createServer((request, response) => {
      const path = (request.url ?? '/').split('?')[0];
      if (request.method !== 'GET' && request.method !== 'HEAD') {
        response.writeHead(405, { allow: 'GET, HEAD' }).end();
        return;
      }
      if (path === '/metrics') {
        this.exporter.getMetricsRequestHandler(request, response);
        return;
      }
      if (path === '/healthz') {
        response.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"alive"}\n');
        return;
      }
      if (path === '/readyz') {
        const { ready, detail } = this.readiness();
        response
          .writeHead(ready ? 200 : 503, { 'content-type': 'application/json' })
          .end(`${JSON.stringify({ ready, status: ready ? 'ready' : 'not ready', ...detail })}\n`);
        return;
      }
      response.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /metrics, /healthz, /readyz\n');
    });
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve((server.address() as AddressInfo).port));
    });
  }

  close(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (!server) return Promise.resolve();
    return new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  }
}
