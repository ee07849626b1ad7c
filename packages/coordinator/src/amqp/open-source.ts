/**
 * The message source, built last (its handlers feed the pipeline) and not
 * started: the daemon starts it once the threads are warm.
 */
import { STEP_TIMEOUT_MS } from '../process/close-steps.js';
import type { StartContext } from '../process/start-context.js';
import { QueueSource } from './queue-source.js';
import type { MessageSource, SourceHandlers } from './message-source.js';

export function openSource(context: StartContext, handlers: SourceHandlers): MessageSource {
  const { config, log } = context;
  const link = new QueueSource(
    {
      nodes: config.amqpNodes,
      queue: config.queue,
      deadLetterQueue: config.deadLetterQueue,
      prefetch: config.prefetch,
      queueType: config.queueType,
      deliveryLimit: config.deliveryLimit,
      partitions: config.partitions,
    },
    log,
    handlers,
  );
  context.closeSteps.add({ name: 'closing amqp', timeoutMs: STEP_TIMEOUT_MS + 100, run: () => link.close(STEP_TIMEOUT_MS) });
  return link;
}
