/**
 * A start-up step against Redis: retried while Redis is away (invariant 8),
 * but a refusal no retry can fix (an ACL that forbids a command, a wrong
 * password) stops the start with one line naming it instead of looping on
 * "redis unavailable"; a stop meanwhile ends the wait.
 */
import { classifyError, describeError, isTallyError, RedisRequirementError, retryUntilDone, RETRY_STOPPED } from '@tally/shared';
import { StartInterrupted, type StartContext } from '../process/start-context.js';

export async function untilRedis<T>(context: Pick<StartContext, 'log' | 'interrupted'>, what: string, step: () => Promise<T>): Promise<T> {
  let outcome: T | typeof RETRY_STOPPED;
  try {
    outcome = await retryUntilDone(step, {
      giveUp: (failureClass, error) => isTallyError(error) || failureClass === 'fatal',
      // A stop while Redis is away ends the wait: the process is on its way out.
      stopWhen: () => context.interrupted(),
      onAttemptFailed: ({ error, attempt, delayMs, failureClass }) =>
        context.log.warn({ what, attempt, delayMs, failureClass, err: describeError(error) }, 'redis unavailable; retrying'),
    });
  } catch (error) {
    if (isTallyError(error) || classifyError(error) === 'bug') throw error;
    throw new RedisRequirementError(
      'TALLY_REDIS_NOPERM',
      `Redis refused the ${what}: ${describeError(error)}; grant the user what docs/redis-requirements.md lists (ACL SETUSER <user> ~<TALLY_PREFIX>* +@read +@write +@scripting +@connection +info +time)`,
    );
  }
  if (outcome === RETRY_STOPPED) throw new StartInterrupted();
  return outcome;
}
