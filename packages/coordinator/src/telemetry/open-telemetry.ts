/**
 * Metrics and the HTTP endpoint (/metrics, /healthz, /readyz), opened when
 * TALLY_METRICS_PORT is set. Every gauge reads its figure at scrape time,
 * from the pipeline and the source once they exist (null or empty before).
 */
import { metrics } from '@opentelemetry/api';
import type { MeterProvider } from '@opentelemetry/sdk-metrics';
import { checkNotInterrupted, type LiveViews, type StartContext } from '../process/start-context.js';
import type { RedisEdge } from '../redis/open-redis.js';
import { HttpEndpoints } from './http-endpoints.js';
import { DaemonMetrics } from './metrics.js';
import { createMetricsExport, METER_NAME } from './metrics-export.js';
import type { CountersEdge } from './open-counters.js';
import { registerSafetyGauges } from './safety-gauges.js';
import { registerStreamGauges } from './stream-gauges.js';
import type { StreamSource } from '../amqp/stream-source.js';

/** The metrics side of the daemon, present when TALLY_METRICS_PORT is set. */
export interface Telemetry {
  readonly metrics: DaemonMetrics;
  readonly meterProvider: MeterProvider;
  readonly endpoints: HttpEndpoints;
  /** The port the HTTP endpoint listens on (TALLY_METRICS_PORT=0 picks one). */
  readonly port: number;
}

export async function openTelemetry(context: StartContext, redis: RedisEdge, counters: CountersEdge, live: LiveViews): Promise<Telemetry | null> {
  const { config, log } = context;
  if (config.metricsPort === null) return null;
  const { exporter, provider: meterProvider, histograms } = await createMetricsExport();
  metrics.setGlobalMeterProvider(meterProvider);
  const { replicaWatch, sentinelWatch } = redis;
  const daemonMetrics = new DaemonMetrics(
    meterProvider.getMeter(METER_NAME),
    { queue: config.queue, mode: config.mode, virtualShards: config.virtualShards },
    {
      counters: () => counters.stats.sinceStart,
      inFlight: () => live.pipeline?.unacked ?? 0,
      shardDepths: () => live.pipeline?.laneDepths() ?? [],
      connections: () => ({ amqp: live.source?.connected ?? false, redis: redis.client.status === 'ready' }),
      // The one source of this figure, also in the heartbeat and /readyz's stall: the AckTracker's lowest unacked tag.
      oldestUnackedAgeSeconds: () => (live.pipeline?.oldestUnackedAgeMs() ?? 0) / 1000,
      ...(config.partitions > 1
        ? {
            partitions: {
              configured: config.partitions,
              held: () => live.source?.partitionsHeld ?? [],
              channels: () => live.pipeline?.channels() ?? [],
            },
          }
        : {}),
      redisRefusals: redis.health,
    },
    histograms,
  );
  registerSafetyGauges(
    meterProvider.getMeter(METER_NAME),
    { 'messaging.system': 'rabbitmq', 'messaging.destination.name': config.queue },
    {
      redisProbe: () => redis.probe,
      amqpBlocked: () => live.source?.brokerState.blocked ?? false,
      unroutableDeadLetters: () => live.source?.brokerState.unroutableDeadLetters ?? 0,
      ...(replicaWatch === null ? {} : { replicasShort: () => replicaWatch.shortfallByMaster() }),
      ...(sentinelWatch === null ? {} : { failovers: () => sentinelWatch.state }),
    },
  );
  if (config.source === 'stream') {
    const stream = () => live.source as StreamSource | null;
    registerStreamGauges(
      meterProvider.getMeter(METER_NAME),
      { 'messaging.system': 'rabbitmq', 'messaging.destination.name': config.queue },
      { figures: () => stream()?.figures() ?? [], refused: () => stream()?.refusedPartitions ?? [] },
    );
  }
  const endpoints = new HttpEndpoints(exporter, () => context.readyz());
  const port = await endpoints.listen(config.metricsPort, config.metricsHost);
  log.info({ host: config.metricsHost, port, paths: ['/metrics', '/healthz', '/readyz'] }, 'http endpoint listening');
  const telemetry: Telemetry = { metrics: daemonMetrics, meterProvider, endpoints, port };
  context.closeSteps.add({
    name: 'closing the metrics endpoint',
    timeoutMs: 500,
    run: async () => {
      await endpoints.close();
      await meterProvider.shutdown();
    },
  });
  checkNotInterrupted(context);
  return telemetry;
}
