/**
 * The one parse a delivery goes through: the contract's shape (message.ts,
 * with its JSON.parse-free common form) when no mapping is declared, the
 * declared mapping (mapped-message.ts) when TALLY_MESSAGE_MAPPING is set.
 * Chosen once, at start: a daemon reads one shape. Pure.
 */
import { parseMappedMessage, type DeliveryProperties } from './mapped-message.js';
import type { MessageMapping } from './message-mapping.js';
import type { ParseOptions, ParseResult } from './message-rules.js';
import { parseMessage } from './message.js';

export type DeliveryParser = (body: Uint8Array, properties: DeliveryProperties) => ParseResult;

export function deliveryParser(mapping: MessageMapping | null, options: ParseOptions): DeliveryParser {
  if (mapping === null) return (body, properties) => parseMessage(body, properties.messageId, options);
  return (body, properties) => parseMappedMessage(body, properties, mapping, options);
}
