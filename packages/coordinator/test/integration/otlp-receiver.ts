/** A minimal OTLP/HTTP JSON trace receiver on loopback, for the trace-link tests. */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ReceivedSpan {
  readonly traceId: string;
  readonly spanId: string;
  readonly name: string;
  readonly kind?: number;
  readonly attributes?: Array<{ key: string; value: Record<string, unknown> }>;
  readonly links?: Array<{ traceId: string; spanId: string }>;
  readonly droppedLinksCount?: number;
  readonly service: string;
}

/** OTLP span kinds, as numbers in the JSON encoding. */
export const SPAN_KIND = Object.freeze({ CONSUMER: 5, PRODUCER: 4 });

export function attribute(span: ReceivedSpan, key: string): unknown {
  const value = span.attributes?.find((a) => a.key === key)?.value;
  if (value === undefined) return undefined;
  if ('intValue' in value) return Number(value.intValue);
  return Object.values(value)[0];
}

export async function startOtlpReceiver(): Promise<{ port: number; spans: ReceivedSpan[]; close(): Promise<void> }> {
  const spans: ReceivedSpan[] = [];
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      if (request.url === '/v1/traces') {
        const payload = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
          resourceSpans: Array<{
            resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> };
            scopeSpans: Array<{ spans: ReceivedSpan[] }>;
          }>;
        };
        for (const rs of payload.resourceSpans) {
          const service = rs.resource.attributes.find((a) => a.key === 'service.name')?.value.stringValue ?? '';
          for (const ss of rs.scopeSpans) for (const span of ss.spans) spans.push({ ...span, service });
        }
      }
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return {
    port: (server.address() as AddressInfo).port,
    spans,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
