export { AckTracker } from './ack-tracker.js';
export { ShardLanes, type PendingPart, type LaneOptions } from './shard-lanes.js';
export { Daemon, type DaemonState } from './daemon.js';
export { ensureLayout } from './layout-guard.js';
export { readCounts, countsToJson } from './commands/counts.js';
export { readStats } from './commands/stats.js';
export { createLogger } from './logger.js';
