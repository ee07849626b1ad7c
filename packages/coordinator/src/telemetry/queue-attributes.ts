/**
 * The messaging attributes that tie a span or a metric to the queue the
 * daemon consumes, as the OpenTelemetry messaging conventions name them, so
 * spans and metrics of one queue join on the same keys.
 */
import type { Attributes } from '@opentelemetry/api';
import {
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  MESSAGING_OPERATION_TYPE_VALUE_PROCESS,
  MESSAGING_SYSTEM_VALUE_RABBITMQ,
} from './semconv.js';

/** RabbitMQ and the queue's name. */
export function queueAttributes(queue: string): Attributes {
  return { [ATTR_MESSAGING_SYSTEM]: MESSAGING_SYSTEM_VALUE_RABBITMQ, [ATTR_MESSAGING_DESTINATION_NAME]: queue };
}

/** The queue's attributes for work done on its messages after delivery (operation type `process`). */
export function processAttributes(queue: string): Attributes {
  return { ...queueAttributes(queue), [ATTR_MESSAGING_OPERATION_TYPE]: MESSAGING_OPERATION_TYPE_VALUE_PROCESS };
}
