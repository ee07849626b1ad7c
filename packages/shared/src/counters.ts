/**
 * The deviation made visible (invariant 9). Each counter lives as a field of
 * the `<prefix>stats` hash, so totals survive restarts and add up across
 * daemons, and is exported as the metric `tally.<field>`.
 */
export const COUNTERS = Object.freeze({
  received: 'deliveries taken from the queue, redeliveries included',
  counted: 'messages whose every part was newly counted',
  duplicates: 'messages recognised as already counted: markers hit, or the same id already in flight',
  partial_duplicates: 'messages with some parts already counted and some not (a crash between shard batches)',
  occupation_failures: 'batches whose marker occupation failed after their counts were written: the crash window was open',
  dead_lettered: 'messages sent to the dead-letter queue',
  redelivered_unmarked: 'redelivered messages none of whose parts was marked: possibly counted again',
  empty: 'valid messages with no change left after filtering (zero deltas, unaccepted types)',
  write_retries: 'count writes retried after a Redis error (each resolved by its write receipt)',
  count_errors:
    'parts Redis refused to count (a foreign value in a count key, a 64-bit overflow): each counted nothing and its message was dead-lettered count-refused',
  undo_failures:
    'parts of refused messages whose counts on another count shard could not be taken back (message-scoped markers on a Redis Cluster: the key changed between the write and the undo): those counts stand, an overcount `tally deviation` does not include; the error log names each key and the delta to subtract before the dead letter is replayed',
  wait_timeouts: 'WAITs (TALLY_REDIS_WAIT_REPLICAS) that timed out before enough replicas acknowledged a batch: retried, its deliveries unacked meanwhile',
  claim_holds:
    'message parts held back because another daemon had claimed them (two-step: a copy of the message was being counted elsewhere at that instant); each is retried until that daemon marks it or its claim runs out',
  claim_takeovers:
    "message parts counted over another daemon's expired claim (two-step: that daemon died or stalled past TALLY_MARKER_CLAIM_TTL_S); if it had written their counts, they are counted again, as after a crash in the window, unless the prefix has fenced adoption (see adopted)",
  adopted:
    'message parts whose counts a batch that died or stalled had written on some count shard, not written again there (fenced adoption, atomic mode on a Redis Cluster): each a double count closed',
  native_claims:
    'message parts claimed by native commands instead of the claim script (two-step, TALLY_MARKER_NATIVE_CLAIMS): the share of claims that spared Redis the script',
  replayed:
    'stream source: messages read again from the log whose parts were at or below their watermarks (a restart, a handover, a rewind): applied once before, skipped now',
  stream_rollbacks:
    'stream source: watermarks found below what this daemon had seen (Redis lost acknowledged writes: a failover without WAIT, a restart without AOF); each partition was replayed from the log',
  stream_gap_offsets:
    'stream source: offsets the log no longer held when a partition resumed (retention deleted them before they were counted): lost to counting, and alerted',
  // Exposure: time integrals, not events, taken while the daemon is under
  // load. Divided by loaded_ms they give how many messages a crash under load
  // puts at risk; the deviation estimator (`tally deviation`) reads them.
  loaded_ms: 'milliseconds during which at least half of the prefetch window was unacked (the daemon under load)',
  window_message_ms: 'message-milliseconds spent inside the crash window (counts written, markers not yet); / loaded_ms = messages a crash re-counts',
  occupied_unacked_message_ms:
    'message-milliseconds marked but not yet acked; / loaded_ms = messages a crash re-counts when its recovery outlasts the marker TTL',
} as const);

export type CounterName = keyof typeof COUNTERS;

/**
 * Counters that commands, not daemons, move, in the same `<prefix>stats`
 * hash: `tally stats` shows them; the daemons' metrics do not export them
 * (a daemon's since-start figure of them would always be 0).
 */
export const OPERATOR_COUNTERS = Object.freeze({
  forced_replays:
    'dead letters `tally dead replay --force` moved back although they may have been counted and their markers may have expired: each may be counted a second time',
} as const);

export type OperatorCounterName = keyof typeof OPERATOR_COUNTERS;
export const OPERATOR_COUNTER_NAMES = Object.freeze(Object.keys(OPERATOR_COUNTERS) as OperatorCounterName[]);
export const COUNTER_NAMES = Object.freeze(Object.keys(COUNTERS) as CounterName[]);

export type CounterValues = Record<CounterName, number>;

export function zeroCounters(): CounterValues {
  const values = {} as CounterValues;
  for (const name of COUNTER_NAMES) values[name] = 0;
  return values;
}
