/**
 * Pure: what the bench reads from the daemon's own /metrics (Prometheus
 * text) to tell where a drain is: deliveries received, and those received
 * but not yet acked (the ack tracker's count, dropped when an ack is sent).
 */

export interface DaemonProgress {
  /** tally_received_total: deliveries taken from the queue. */
  readonly received: number;
  /** tally_deliveries_in_flight: received and not yet acked. */
  readonly inFlight: number;
  /** received − inFlight: deliveries acked. */
  readonly acked: number;
  /** tally_batch_size_count and _sum: shard batches sent so far and their parts; null when the daemon reports none yet. */
  readonly batches: number | null;
  readonly batchParts: number | null;
}

/** The value of the first sample of a metric (any labels), or null when the text has none. */
export function metricValue(text: string, name: string): number | null {
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== '{' && rest[0] !== ' ') continue;
    const value = Number(
      rest
        .slice(rest.lastIndexOf(rest.includes('}') ? '}' : ' ') + 1)
        .trim()
        .split(/\s+/)[0],
    );
    if (Number.isFinite(value)) return value;
  }
  return null;
}

export function parseDaemonProgress(text: string): DaemonProgress {
  const received = metricValue(text, 'tally_received_total');
  const inFlight = metricValue(text, 'tally_deliveries_in_flight');
  if (received === null || inFlight === null) throw new Error('the daemon /metrics has no tally_received_total or tally_deliveries_in_flight');
  return {
    received,
    inFlight,
    acked: received - inFlight,
    batches: metricValue(text, 'tally_batch_size_count'),
    batchParts: metricValue(text, 'tally_batch_size_sum'),
  };
}

/** Mean parts per shard batch between two reads (a window); null when either read lacks the histogram or no batch ran. */
export function partsPerBatch(from: DaemonProgress | null, to: DaemonProgress | null): number | null {
  if (to?.batches == null || to.batchParts == null) return null;
  // No read at the start (no warm-up): the window is the daemon's whole life.
  const batches = to.batches - (from === null ? 0 : (from.batches ?? Number.NaN));
  const parts = to.batchParts - (from === null ? 0 : (from.batchParts ?? Number.NaN));
  return Number.isFinite(batches) && batches > 0 ? parts / batches : null;
}
