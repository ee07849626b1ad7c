/**
 * The message source, built last (its handlers feed the pipeline) and not
 * started: the daemon starts it once the threads are warm. A queue
 * (queue-source.ts) or, with TALLY_SOURCE=stream, RabbitMQ streams
 * (stream-source.ts), whose checkpoints and watermarks it shares with the
 * pipeline through `stream`.
 */
import { loadFaultInjection } from '@tally/shared';
import { STEP_TIMEOUT_MS } from '../process/close-steps.js';
import type { StartContext } from '../process/start-context.js';
import type { RedisEdge } from '../redis/open-redis.js';
import { CheckpointStore } from '../stream/checkpoint-store.js';
import type { StreamState } from '../stream/stream-state.js';
import { readWatermarks } from '../stream/watermark-audit.js';
import type { CountersEdge } from '../telemetry/open-counters.js';
import type { MessageSource, SourceHandlers } from './message-source.js';
import { QueueSource } from './queue-source.js';
import { StreamSource } from './stream-source.js';

export interface SourceInputs {
  readonly redis: RedisEdge;
  readonly counters: CountersEdge;
  /** TALLY_SOURCE=stream: the state shared with the pipeline; null for a queue. */
  readonly stream: StreamState | null;
}

export function openSource(context: StartContext, handlers: SourceHandlers, inputs: SourceInputs): MessageSource {
  const { config, log } = context;
  const common = {
    nodes: config.amqpNodes,
    queue: config.queue,
    deadLetterQueue: config.deadLetterQueue,
    prefetch: config.prefetch,
    partitions: config.partitions,
  };
  const source =
    inputs.stream === null
      ? new QueueSource({ ...common, queueType: config.queueType, deliveryLimit: config.deliveryLimit }, log, handlers)
      : new StreamSource(
          {
            ...common,
            checkpointMs: config.checkpointMs,
            windowMs: config.streamDedup ? config.markerTtlS * 1000 : 0,
            overlap: loadFaultInjection(process.env).streamOverlap,
          },
          {
            state: inputs.stream,
            checkpoints: new CheckpointStore(inputs.redis.client, config.prefix),
            counters: inputs.counters.stats,
            readWatermarks: (partition, shards) => readWatermarks(inputs.redis.client, config.prefix, partition, shards),
          },
          log,
          handlers,
        );
  context.closeSteps.add({ name: 'closing amqp', timeoutMs: STEP_TIMEOUT_MS + 100, run: () => source.close(STEP_TIMEOUT_MS) });
  return source;
}
