export { freePort, freePorts } from './free-port.js';
export { parseInfo } from './redis-info.js';
export { startPrivateRedis, type PrivateRedis, type PrivateRedisOptions } from './private-redis.js';
export { startRedisCluster, CLUSTER_SLOTS, type RedisCluster, type RedisClusterOptions, type ClusterNode, type Failover } from './redis-cluster.js';
export { parseClusterNodes, type ClusterNodeLine } from './cluster-nodes.js';
export { startProxy, type ProxyControl } from './tcp-proxy.js';
export { resetNamespace, type Namespace } from './namespace.js';
export { readMarkers, markerEntry, type MarkerSnapshot } from './markers.js';
