/**
 * Bounded waiting for the shutdown: a close step that the server never
 * answers (a SIGSTOPped Redis, a hung broker) must not hold the process past
 * its grace period. The work itself is not cancelled, only no longer awaited;
 * the caller forces what can be forced (disconnect, destroy the socket).
 */
export const TIMED_OUT: unique symbol = Symbol('timed out');

/** `work`'s value, or TIMED_OUT once `ms` have passed first. A rejection is rethrown. */
export async function within<T>(ms: number, work: Promise<T>): Promise<T | typeof TIMED_OUT> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<typeof TIMED_OUT>((resolve) => {
    timer = setTimeout(() => resolve(TIMED_OUT), Math.max(0, ms));
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
