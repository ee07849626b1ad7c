/**
 * The daemon's teardown, written once: each collaborator adds its close step
 * as it is opened, and the same steps close a start that failed halfway and a
 * stop. The order of a close is fixed by CLOSE_ORDER, not by the order things
 * were opened in: the threads are started before the channel (a delivery
 * needs them) yet must stop before it closes.
 */
import { describeError } from '@tally/shared';
import { within, TIMED_OUT } from './deadline.js';
import type { Logger } from './logger.js';

/**
 * One step: run in order, each on its own, a failure logged by name and the
 * next one run anyway. A step with `timeoutMs` is waited for at most that
 * long (and never past the close's deadline); `force` then cuts what it was
 * waiting for.
 */
export interface CloseStep {
  readonly name: string;
  run(): unknown;
  readonly timeoutMs?: number;
  force?(): void;
}

/**
 * The order of a close, by step name, and why:
 * - the threads first (their spans flushed before): a batch still writing
 *   after the channel closed (and the broker handed its deliveries to another
 *   daemon) could count them a second time; a terminated thread writes
 *   nothing more;
 * - the stats flush once no thread can report anything more;
 * - the channel: only now do the unacked deliveries go back to the broker;
 * - the heartbeat and the replica and sentinel watches, then Redis (they use its client);
 * - the metrics endpoint last: it answers until the end.
 */
export const CLOSE_ORDER = [
  'flushing worker spans',
  'stopping worker threads',
  'final stats flush',
  'closing amqp',
  'stopping the heartbeat',
  'stopping the replica watch',
  'stopping the sentinel watch',
  'closing redis',
  'closing the metrics endpoint',
] as const;

export type CloseStepName = (typeof CLOSE_ORDER)[number];

/**
 * Time the closing steps may take after the grace period, in total. Every
 * step that waits on a server is bounded by it, so a stop ends within
 * TALLY_SHUTDOWN_GRACE_MS plus this whatever Redis or RabbitMQ do; main.ts's
 * backstop (SHUTDOWN_MARGIN_MS) is a little longer still.
 */
export const CLOSE_BUDGET_MS = 2_500;
/** The most one closing step waits for its server. */
export const STEP_TIMEOUT_MS = 1_000;

/** Runs `steps` in order, each guarded on its own; `progress` names the one running (null at the end). */
export async function runSteps(steps: readonly CloseStep[], log: Logger, progress: (step: string | null) => void, deadlineAt = Infinity): Promise<void> {
  for (const step of steps) {
    progress(step.name);
    try {
      const work = Promise.resolve().then(() => step.run());
      if (step.timeoutMs === undefined) await work;
      else {
        const budget = Math.max(0, Math.min(step.timeoutMs, deadlineAt - performance.now()));
        if ((await within(budget, work)) === TIMED_OUT) {
          log.warn({ step: step.name, waitedMs: Math.round(budget) }, `${step.name}: no answer in time; going on`);
          step.force?.();
        }
      }
    } catch (error) {
      log.warn({ step: step.name, err: describeError(error) }, `${step.name} failed`);
    }
  }
  progress(null);
}

/**
 * The close steps of what has been opened so far. Each step runs once: a
 * close takes the steps it runs, so a second close (a stop that arrived
 * while a failed start was closing) runs only what was added since, after
 * the first one ended.
 */
export class CloseSteps {
  private readonly steps = new Map<CloseStepName, CloseStep>();
  private closing: Promise<void> = Promise.resolve();

  constructor(private readonly log: Logger) {}

  /** Registers the close step of something just opened. */
  add(step: CloseStep & { readonly name: CloseStepName }): void {
    if (this.steps.has(step.name)) throw new Error(`close step "${step.name}" added twice`);
    this.steps.set(step.name, step);
  }

  /** Runs every step added so far, in CLOSE_ORDER, none past `deadlineAt` (performance.now() ms). */
  close(progress: (step: string | null) => void, deadlineAt: number): Promise<void> {
    this.closing = this.closing.then(() => {
      const due = CLOSE_ORDER.flatMap((name) => this.steps.get(name) ?? []);
      this.steps.clear();
      return runSteps(due, this.log, progress, deadlineAt);
    });
    return this.closing;
  }
}
