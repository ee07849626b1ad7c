/**
 * @tally/runtime: the I/O edges the daemon and its worker threads share (Redis clients, cluster slots, tracing).
 */
export {
  clusterOptions,
  COMMAND_TIMEOUT_MS,
  connectRedis,
  createRedisClient,
  detectRedisTopology,
  isCluster,
  isSentinelClient,
  nodeAddress,
  ONE_SHOT,
  masterForKey,
  onSlotConnection,
  RECONNECT_BACKOFF,
  scanNodes,
  sentinelOptions,
  whenClusterReady,
  type RedisClient,
} from './redis-connection.js';
export { CLUSTER_SLOT_COUNT, crc16, hashedPart, keySlot } from './key-slot.js';
export { startTracing, traceIdsOfActiveSpan, tracingRequested, type TracingHandle } from './tracing.js';
export { REVIVING, REVIVING_MESSAGE, SentinelPrimaryClient } from './sentinel-primary-client.js';
export { askSentinels, SentinelReader, type SentinelAnswer, type SentinelReaderOptions } from './sentinel-query.js';
