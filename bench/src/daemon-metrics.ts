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
  return { received, inFlight, acked: received - inFlight };
}
