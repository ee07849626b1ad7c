export {
  clusterOptions,
  connectionGeneration,
  connectRedis,
  createRedisClient,
  detectRedisTopology,
  isCluster,
  markConnection,
  masterForKey,
  onSlotConnection,
  RECONNECT_BACKOFF,
  sameConnection,
  scanNodes,
  whenClusterReady,
  type ConnectionMark,
  type RedisClient,
} from './redis-connection.js';
export { CLUSTER_SLOT_COUNT, crc16, hashedPart, keySlot } from './key-slot.js';
export { startTracing, traceIdsOfActiveSpan, tracingRequested, type TracingHandle } from './tracing.js';
