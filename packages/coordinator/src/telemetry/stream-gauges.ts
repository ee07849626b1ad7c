/**
 * TALLY_SOURCE=stream: one series per stream partition this daemon holds,
 * labelled `partition`, read at each scrape from what the source last
 * probed (stream-source.ts, every few checkpoints):
 *
 *   tally.stream.first_offset      the oldest offset the stream still holds (retention moves it)
 *   tally.stream.last_offset       the newest offset
 *   tally.stream.committed_offset  the committed checkpoint: everything up to it is applied
 *   tally.stream.lag               offsets from the checkpoint to the last one (messages to read)
 *   tally.stream.lag_seconds       age of the checkpointed message when the stream is ahead of it
 *                                  (its timestamp property); 0 when caught up, absent without a timestamp
 *   tally.stream.refused           1 per partition refused (its stream is not the one checkpointed)
 *
 * The alert rules compare committed with first and last: a checkpoint in
 * the oldest tenth of what the stream keeps is about to be overtaken by
 * retention (deploy/prometheus/tally.rules.yml, TallyStreamNearRetention).
 */
import type { Attributes, Meter } from '@opentelemetry/api';

/** What the source knows of one partition it holds. */
export interface StreamFigures {
  readonly partition: number;
  readonly first: number | null;
  readonly last: number | null;
  readonly committed: number | null;
  readonly lagSeconds: number | null;
}

export interface StreamGaugeSources {
  figures(): readonly StreamFigures[];
  refused(): ReadonlyArray<{ readonly partition: number }>;
}

export function registerStreamGauges(meter: Meter, base: Attributes, sources: StreamGaugeSources): void {
  const each = (read: (f: StreamFigures) => number | null) => (result: { observe(value: number, attributes: Attributes): void }) => {
    for (const figures of sources.figures()) {
      const value = read(figures);
      if (value !== null) result.observe(value, { ...base, partition: String(figures.partition) });
    }
  };
  meter
    .createObservableGauge('tally.stream.first_offset', { description: 'The oldest offset the stream still holds (retention moves it)' })
    .addCallback(each((f) => f.first));
  meter.createObservableGauge('tally.stream.last_offset', { description: 'The newest offset of the stream' }).addCallback(each((f) => f.last));
  meter
    .createObservableGauge('tally.stream.committed_offset', { description: 'The committed checkpoint: every message up to it is applied on every shard' })
    .addCallback(each((f) => f.committed));
  meter
    .createObservableGauge('tally.stream.lag', {
      description: 'Offsets from the committed checkpoint to the last one: messages still to read',
      unit: '{message}',
    })
    .addCallback(each((f) => (f.last === null ? null : Math.max(0, f.last - (f.committed ?? (f.first ?? 0) - 1)))));
  meter
    .createObservableGauge('tally.stream.lag_seconds', {
      description: 'How old the checkpointed message is while the stream is ahead of it (its timestamp property), in seconds; 0 when caught up',
    })
    .addCallback(each((f) => f.lagSeconds));
  meter
    .createObservableGauge('tally.stream.refused', {
      description: '1 for a partition refused because its stream is not the one checkpointed (deleted and recreated)',
    })
    .addCallback((result) => {
      for (const { partition } of sources.refused()) result.observe(1, { ...base, partition: String(partition) });
    });
}
