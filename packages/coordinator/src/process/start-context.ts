/**
 * What every opener of the daemon's edges is given (runtime.ts composes
 * them): the configuration, the log, the close steps to register with, and
 * the daemon's own answers to "was the start interrupted?" and "is it
 * stopping?". Also the late-bound views of the pipeline and the message
 * source: the heartbeat, the meter and the gauges are opened before them but
 * read their figures from the start.
 */
import type { InjectedBug, TallyConfig } from '@tally/shared';
import type { MessageSource, SourceHandlers } from '../amqp/message-source.js';
import type { DeliveryPipeline } from '../pipeline/delivery-pipeline.js';
import type { BatchRunner } from '../pipeline/ports.js';
import type { BugHandler } from './bug-exit.js';
import type { CloseSteps } from './close-steps.js';
import type { Logger } from './logger.js';

export interface StartContext {
  readonly config: TallyConfig;
  readonly log: Logger;
  /** This daemon's id in its heartbeat key and mode lease. */
  readonly daemonId: string;
  /** Names this daemon's two-step claims. */
  readonly claimToken: string;
  /** Where each collaborator's close step goes as soon as it is open. */
  readonly closeSteps: CloseSteps;
  /** True once a stop came while the daemon was starting: the start gives up at its next step. */
  interrupted(): boolean;
  /** Whether the daemon is stopping: a channel closing then is the stop, not a loss. */
  stopping(): boolean;
  /** What /readyz answers. */
  readyz(): { ready: boolean; detail: Record<string, unknown> };
  /** What main.ts gives the daemon besides its configuration: the bug handler and fault injection. */
  readonly options: DaemonOptions;
}

/** The pipeline and the source once they exist: null until the composition has built them. */
export interface LiveViews {
  pipeline: DeliveryPipeline | null;
  source: MessageSource | null;
}

/** The worker threads as the daemon uses them: a batch runner it warms up before the first delivery. */
export interface Threads extends BatchRunner {
  /** Resolves once every thread has loaded its modules and reached Redis. */
  warm(): Promise<void>;
}

/**
 * The two edges a test may replace (test/integration/daemon.test.ts runs the
 * whole daemon in-process with a fake broker and fake threads). Each opener
 * registers its own close steps.
 */
export interface ReplaceableEdges {
  openThreads?(context: StartContext): Threads;
  openSource?(context: StartContext, handlers: SourceHandlers): MessageSource;
}

/** What main.ts gives the daemon besides its configuration. */
export interface DaemonOptions {
  /**
   * Told of a bug met on the batch or delivery path (bug-exit.ts): main.ts
   * logs it and exits 70. By default the error is rethrown.
   */
  readonly onBug?: BugHandler;
  /** TALLY_FAULT_BUG=main (config.ts loadFaultInjection): each delivery makes the ack tracker throw. */
  readonly injectBug?: InjectedBug | null;
  /** Tests only: fakes in place of the worker threads and the broker. */
  readonly edges?: ReplaceableEdges;
}

/** A stop came while the daemon was starting: what was opened is closed, the start ends without running. */
export class StartInterrupted extends Error {
  constructor() {
    super('start interrupted by a stop');
    this.name = 'StartInterrupted';
  }
}

/** Throws StartInterrupted when a stop came meanwhile: called between the steps of a start. */
export function checkNotInterrupted(context: Pick<StartContext, 'interrupted'>): void {
  if (context.interrupted()) throw new StartInterrupted();
}
