/**
 * The settings a worker thread gets from its daemon, for tests that run a
 * batch directly (no daemon): the daemon's defaults for a fresh prefix, any
 * of them overridden. One place, so a new setting is added once.
 */
import { DEFAULTS, defaultBucketWidthS, type WorkerSettings } from '@tally/shared';

export function testWorkerSettings(settings: Pick<WorkerSettings, 'redisUrl' | 'prefix'> & Partial<WorkerSettings>): WorkerSettings {
  const markerTtlS = settings.markerTtlS ?? DEFAULTS.markerTtlS;
  return {
    mode: 'two-step',
    markerTtlS,
    countTtlS: DEFAULTS.countTtlS,
    logLevel: 'silent',
    waitReplicas: 0,
    waitTimeoutMs: 1000,
    markerBucketS: defaultBucketWidthS(markerTtlS),
    markerSubBuckets: DEFAULTS.markerSubBuckets,
    claimToken: 'a1',
    claimTtlMs: 30_000,
    ...settings,
  };
}
