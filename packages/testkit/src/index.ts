/**
 * @tally/testkit: test helpers (private Redis servers and clusters, RabbitMQ nodes, a TCP proxy, TLS
 * certificates, namespace cleanup); a dev dependency only.
 */
export { freePort, freePorts } from './free-port.js';
export { asAdmin, startPrivateRedis, type PrivateRedis, type PrivateRedisOptions } from './private-redis.js';
export type { RedisAccess, RedisTlsFiles } from './redis-process.js';
export { startRedisCluster, CLUSTER_SLOTS, type RedisCluster, type RedisClusterOptions, type ClusterNode, type Failover } from './redis-cluster.js';
export { parseClusterNodes, type ClusterNodeLine } from './cluster-nodes.js';
export { startProxy, type ProxyControl } from './tcp-proxy.js';
export { deleteKeys, resetNamespace, type Namespace } from './namespace.js';
export { markerEntry, markersDone, readMarkers, writeClaim, writeDoneMarker, type MarkerPlace, type MarkerRef, type MarkerSnapshot } from './markers.js';
export { testWorkerSettings } from './worker-settings.js';
export { makeTestCertificates, type TestCertificates } from './tls-certificates.js';
export { startRabbitCluster, type RabbitCluster, type RabbitClusterOptions, type RabbitNode, type RabbitTlsFiles } from './rabbit-cluster.js';
export { startSentinelGroup, type SentinelGroup, type SentinelGroupOptions } from './redis-sentinel.js';
