/**
 * The publish options of a copy of a message Tally moves between queues (to
 * `<queue>.dead`, or back by `tally dead replay`): the same properties a
 * consumer might read, persistent, and mandatory so that a copy no queue takes
 * comes back as basic.return (and then is still confirmed) instead of being
 * dropped. Only the headers differ from move to move.
 */
import type { MessageProperties, Options } from 'amqplib';

export function copyPublishOptions(properties: MessageProperties, headers: Record<string, unknown>): Options.Publish {
  return {
    persistent: true,
    mandatory: true,
    headers,
    contentType: properties.contentType,
    contentEncoding: properties.contentEncoding,
    messageId: properties.messageId,
    correlationId: properties.correlationId,
    timestamp: properties.timestamp,
    type: properties.type,
    appId: properties.appId,
  };
}
