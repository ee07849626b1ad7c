/**
 * What @tally/shared gives the other packages, named one by one: a reader
 * sees here what crosses the package boundary, and a symbol no other package
 * uses stays internal to its module (its own tests import the module).
 * Grouped by module, in the order the design reads: errors and
 * configuration, messages and shards, markers and batches, then the Redis
 * and deviation arithmetic.
 */
export {
  CliUsageError,
  describeError,
  isTallyError,
  MarkerFormatRefusedError,
  ModeSwitchRefusedError,
  PartitionCountMismatchError,
  QueueMissingError,
  RedisRequirementError,
  ReplayRefusedError,
  ShardLayoutMismatchError,
  TallyError,
  UnknownReplyError,
} from './errors.js';
export { redactUrl } from './redact.js';
export { DEFAULT_SENTINEL_PORT, isSentinelUrl, parseSentinelUrl, type SentinelAddress, type SentinelTarget } from './sentinel-url.js';
export {
  failoverFlags,
  joinAddress,
  type PrimaryChange,
  type PrimaryState,
  PrimaryTracker,
  type SentinelMasterInfo,
  sentinelMasterFromReply,
  type SentinelObservation,
} from './sentinel-state.js';
export { nextNodeIndex, splitAmqpUrls } from './broker-nodes.js';
export { tlsTrustFailure } from './tls-trust.js';
export {
  DEFAULTS,
  type FaultInjection,
  type InjectedBug,
  loadConfig,
  loadFaultInjection,
  type LogLevel,
  type QueueType,
  splitRedisUrls,
  type TallyConfig,
  type TallyMode,
  type TallySource,
  TALLY_SETTINGS,
  unknownSettingError,
} from './config.js';
export { closestName, editDistance } from './closest-name.js';
export { BAD_MESSAGE_REASONS, type BadMessageReason, type Change, formatReason, MESSAGE_LIMITS, parseMessage } from './message.js';
export { type MessageMapping, parseMessageMapping } from './message-mapping.js';
export { mappedIdValue } from './mapped-message.js';
export { deliveryParser, type DeliveryParser } from './delivery-parser.js';
export { ownerOf, type PartChanges, SHARD_HASH, shardOf, ShardSplit, splitByShard, splitInto, wholeMessageInto } from './shards.js';
export { CONSISTENT_HASH_EXCHANGE, PARTITION_WEIGHT, partitionQueue, partitionQueues, partitionsOf } from './partitions.js';
export {
  checkpointKey,
  countKey,
  countScanPattern,
  daemonKey,
  daemonScanPattern,
  escapeGlob,
  layoutKey,
  legacyMarkerKey,
  legacyMarkerScanPattern,
  markerScanPattern,
  receiptKey,
  standingKey,
  skuOfCountKey,
  statsKey,
  watermarkKey,
} from './keys.js';
export {
  bucketExpiresAt,
  bucketOf,
  bucketsToCheck,
  defaultBucketWidthS,
  defaultMarkerScope,
  messageScopeServes,
  needsFencedAdoption,
  fencedAdoptionOf,
  FENCED_MESSAGE_MARKER_FORMAT,
  type DigestText,
  filterBlocksFor,
  filterSlotOf,
  LEGACY_MARKER_FORMAT,
  MARKER_FORMAT,
  markerBaseKey,
  markerBucketKey,
  markerDigest,
  markerDigestText,
  markerFilterBits,
  markerFormatOf,
  markerMetaKey,
  type MarkerScope,
  markerScopeOf,
  markerShardOf,
  markersPerSubBucket,
  MESSAGE_MARKER_FORMAT,
  FILTERED_MARKER_FORMAT,
  FILTER_BITS,
  filterBitsOfFormat,
  messageMarkerShards,
  oldestLiveBucket,
  parseMarkerBucketKey,
  parsePartFlags,
  PART_DONE,
  PART_HELD,
  PART_NEW,
  PART_REWIND,
  subBucketOf,
  isPowerOfTwo,
  subBucketsAfter,
  taskDigests,
} from './markers.js';
export { ScriptReply } from './script-replies.js';
export { COUNTER_NAMES, type CounterName, COUNTERS, type CounterValues, OPERATOR_COUNTER_NAMES, type OperatorCounterName, zeroCounters } from './counters.js';
export { backoffDelay, type BackoffOptions } from './backoff.js';
export { ClassifiedFailure, classifyError, type FailureClass } from './failure-class.js';
export { RETRY_STOPPED, retryUntilDone } from './retry.js';
export {
  type BatchReply,
  type BatchResult,
  type BatchTask,
  type CountRefusal,
  decodeBatchTask,
  encodeBatchTask,
  partName,
  transferListOf,
  type WireBatchTask,
  type WireParts,
  type WorkerSettings,
} from './batch-protocol.js';
export { decodePositions, encodePositions, type WatermarkReport } from './stream-positions.js';
export { IdWindow } from './id-window.js';
export { isThreadEvent, isThreadReply, type ThreadEvent, type ThreadReply, type ThreadRequest, type ThreadRequestKind } from './thread-protocol.js';
export { type DeviationEstimate, estimateDeviation, formatDeviation, parseRecovery } from './deviation.js';
export {
  assessRedis,
  classifyRedisFailure,
  factsFromInfo,
  parseInfo,
  parseVersion,
  plaintextPortProblem,
  type RedisFacts,
  type RedisFailure,
  type RedisTopology,
  type RedisWarning,
  requirementError,
  versionAtLeast,
} from './redis-requirements.js';
export {
  BROKER_DEAD_REASONS,
  COUNT_REFUSED,
  DEAD_AT_HEADER,
  deadLetterReason,
  FIRST_DEAD_AT_HEADER,
  STANDING_COUNTS_HEADER,
  standingCountsOf,
  standingCountsOfRecord,
  TALLY_DEAD_REASONS,
  type StandingCounts,
} from './dead-letter.js';
export { WindowGauge } from './window-gauge.js';
export { describeRefusal, isServerRefusal, type RedisHealthEvent } from './redis-health.js';
export { describeShards, describeShortMaster, findShortMasters, replicationFromInfo, shortfallChanges, type ShortMaster } from './replica-shortfall.js';
