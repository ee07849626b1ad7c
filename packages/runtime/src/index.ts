export { createRedisClient, RECONNECT_BACKOFF } from './redis-connection.js';
export { startTracing, traceIdsOfActiveSpan, tracingRequested, type TracingHandle } from './tracing.js';
