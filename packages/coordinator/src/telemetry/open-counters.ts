/**
 * The counters of invariant 9 and the exposure meter, opened once Redis
 * answers: the counters accumulate in <prefix>stats (a failed flush reports
 * to the Redis health like any writer), and the meter integrates what a
 * crash would cost right now for `tally deviation`.
 */
import { describeRefusal, isServerRefusal, WindowGauge } from '@tally/shared';
import { STEP_TIMEOUT_MS } from '../process/close-steps.js';
import type { LiveViews, StartContext } from '../process/start-context.js';
import type { RedisEdge } from '../redis/open-redis.js';
import { DEFAULT_SAMPLING, ExposureMeter } from './exposure-meter.js';
import { StatsRecorder } from './stats-recorder.js';

export interface CountersEdge {
  readonly stats: StatsRecorder;
  /** What a crash would cost right now, integrated for `tally deviation`. */
  readonly exposure: ExposureMeter;
  /** Two-step mode: the shared memory where threads mark which messages sit in a crash window; null in atomic mode. */
  readonly windowGauge: WindowGauge | null;
}

export function openCounters(context: StartContext, redis: RedisEdge, live: LiveViews): CountersEdge {
  const { config, log, closeSteps } = context;
  const { health } = redis;
  const stats = new StatsRecorder(redis.client, config.prefix, log, (error) => {
    if (error === null || error === undefined) health.recovered('stats flush');
    else {
      const refusal = describeRefusal(error);
      if (isServerRefusal(refusal.failureClass)) health.refused('stats flush', refusal.errorType, refusal.failureClass, refusal.message);
    }
  });
  stats.start();
  // Only two-step mode over a queue has a crash window to show.
  const windowGauge = config.mode === 'two-step' && config.source === 'queue' ? WindowGauge.create(config.virtualShards) : null;
  const exposure = new ExposureMeter(
    {
      sink: stats,
      loaded: () => (live.pipeline?.unacked ?? 0) * 2 >= config.prefetch,
      windowNow: windowGauge === null ? null : () => windowGauge.messages(),
      settling: windowGauge,
    },
    DEFAULT_SAMPLING,
  );
  exposure.start();
  closeSteps.add({
    name: 'final stats flush',
    timeoutMs: STEP_TIMEOUT_MS,
    run: () => {
      exposure.stop();
      stats.stop();
      return stats.flush();
    },
  });
  return { stats, exposure, windowGauge };
}
