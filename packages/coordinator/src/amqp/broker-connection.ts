/**
 * One connection to RabbitMQ, kept up: the nodes of TALLY_AMQP_URL tried in
 * order, each failed connect and each lost connection moving to the next
 * node with the same backoff between attempts (a node gone for good costs
 * one failed attempt per round, never a wait on it alone). Both message
 * sources (queue-source.ts, stream-source.ts) sit on it: it knows nothing of
 * queues, offsets or deliveries, only when a connection is up and when it
 * went away.
 *
 *   idle ──start()──► connecting ──► up ──lost──► connecting ──► up …
 *                         │           │
 *                         │           └──close()──► closed
 *                         └── refused at the first connect: start() rejects (one line naming the fix)
 *
 * `stopping` (stopConsuming) keeps the connection, so what is in flight can
 * still be acked, but a loss is no longer followed by a reconnect.
 */
import amqp, { type ChannelModel } from 'amqplib';
import { describeError, isTallyError, nextNodeIndex, redactUrl, retryUntilDone, TallyError } from '@tally/shared';
import { within, TIMED_OUT } from '../process/deadline.js';
import type { Logger } from '../process/logger.js';
import { amqpReplyCode, classifyBrokerRefusal } from './broker-refusal.js';
import type { AmqpBrokerState } from './message-source.js';

export interface BrokerConnectionOptions {
  /** The nodes of TALLY_AMQP_URL, in order (one for a single broker). */
  readonly nodes: readonly string[];
  /** What a refusal names besides the node: the queue and its dead-letter queue. */
  readonly queue: string;
  readonly deadLetterQueue: string;
  /** The connection's name in the broker's management UI. */
  readonly connectionName: string;
}

export interface BrokerConnectionHandlers {
  /** Run on every new connection before it counts as up (declarations); a throw fails the attempt. */
  prepare(model: ChannelModel): Promise<void>;
  /** The connection is up: `node` is its URL, `index` its position in the list. */
  up(model: ChannelModel, node: string, index: number): Promise<void>;
  /** The connection went away (a reconnect follows unless stopping or closed). */
  down(reason: string): void;
}

type Lifecycle =
  | { readonly state: 'idle' }
  | { readonly state: 'connecting' }
  | { readonly state: 'up'; readonly model: ChannelModel; readonly node: string }
  | { readonly state: 'stopping'; readonly model: ChannelModel | null; readonly node: string | null }
  | { readonly state: 'closed' };

export type BrokerConnectionState = Lifecycle['state'];

export class BrokerConnection {
  private lifecycle: Lifecycle = { state: 'idle' };
  private everConnected = false;
  /** The node the next connect goes to; moved on by every failed connect and every lost connection. */
  private nodeIndex = 0;
  private blocked: { reason: string; since: Date } | null = null;
  private unroutable = 0;

  constructor(
    private readonly options: BrokerConnectionOptions,
    private readonly log: Logger,
    private readonly handlers: BrokerConnectionHandlers,
  ) {}

  get state(): BrokerConnectionState {
    return this.lifecycle.state;
  }

  /** The live connection; null unless up (or stopping with one). */
  get model(): ChannelModel | null {
    const lifecycle = this.lifecycle;
    return lifecycle.state === 'up' || lifecycle.state === 'stopping' ? lifecycle.model : null;
  }

  /** The node connected to, redacted; null while there is none. */
  get node(): string | null {
    const lifecycle = this.lifecycle;
    const node = lifecycle.state === 'up' || lifecycle.state === 'stopping' ? lifecycle.node : null;
    return node === null ? null : redactUrl(node);
  }

  get brokerState(): AmqpBrokerState {
    return {
      blocked: this.blocked !== null,
      blockedReason: this.blocked?.reason ?? null,
      blockedSince: this.blocked?.since.toISOString() ?? null,
      unroutableDeadLetters: this.unroutable,
    };
  }

  /** A dead-letter copy came back unroutable (dead-letter-publishing.ts counts it here, for the gauge). */
  countUnroutable(): void {
    this.unroutable++;
  }

  /** Connects (retrying transient failures); rejects with one line naming the fix when the broker refuses the first connect. */
  async start(): Promise<void> {
    if (this.lifecycle.state !== 'idle') throw new Error(`start() called in state ${this.lifecycle.state}`);
    await this.connectUntilUp();
  }

  /** No reconnect from now on; the connection stays for what is in flight. */
  stopping(): void {
    const lifecycle = this.lifecycle;
    if (lifecycle.state === 'closed') return;
    this.lifecycle =
      lifecycle.state === 'up' ? { state: 'stopping', model: lifecycle.model, node: lifecycle.node } : { state: 'stopping', model: null, node: null };
  }

  private async connectUntilUp(): Promise<void> {
    const { nodes } = this.options;
    this.lifecycle = { state: 'connecting' };
    let node = nodes[this.nodeIndex]!;
    const target = () => ({ url: node, queue: this.options.queue, deadLetterQueue: this.options.deadLetterQueue });
    try {
      await retryUntilDone(
        async () => {
          node = nodes[this.nodeIndex]!;
          try {
            await this.connectOnce(node);
          } catch (error) {
            this.nodeIndex = nextNodeIndex(this.nodeIndex, nodes.length);
            throw error;
          }
          this.everConnected = true;
        },
        {
          // Ends without connecting when a stop or close moved the state on meanwhile.
          stopWhen: () => this.lifecycle.state !== 'connecting',
          // A refusal at start (login, permissions, an untrusted certificate) is configuration: one line naming the fix.
          // So is a refusal of Tally's own (a queue of the stream's name that is not a stream): it names its fix already.
          giveUp: (_failureClass, error) => !this.everConnected && (isTallyError(error) || classifyBrokerRefusal(error, target()) !== null),
          onAttemptFailed: ({ error, attempt, delayMs }) =>
            this.log.warn(
              { url: redactUrl(node), next: redactUrl(nodes[this.nodeIndex]!), attempt, delayMs, err: describeError(error) },
              'amqp connect failed; retrying',
            ),
        },
      );
    } catch (error) {
      if (isTallyError(error)) throw error;
      const refusal = classifyBrokerRefusal(error, target());
      throw new TallyError(refusal?.code ?? 'TALLY_AMQP_REFUSED', `${refusal?.line ?? describeError(error)} (broker ${redactUrl(node)})`, { cause: error });
    }
  }

  private async connectOnce(node: string): Promise<void> {
    const model = await amqp.connect(node, { clientProperties: { connection_name: this.options.connectionName } });
    // From the first moment: a channel the broker closes re-emits its error on
    // the connection, and an 'error' without a listener is an uncaught throw.
    // A connection exception (503 COMMAND_INVALID for an exchange type the
    // broker lacks) closes the whole connection: the pending declare then
    // fails with amqplib's "Channel ended", which names nothing. The broker's
    // own close is the error to classify and report.
    let closedBy: Error | null = null;
    model.on('error', (error: Error) => {
      closedBy ??= error;
      this.log.warn({ err: describeError(error) }, 'amqp connection error');
    });
    this.watchAlarms(model);
    try {
      await this.handlers.prepare(model);
      if (this.lifecycle.state !== 'connecting') {
        await model.close().catch(() => {});
        return;
      }
      this.lifecycle = { state: 'up', model, node };
      model.on('close', (error?: Error) => this.lost(model, error ? describeError(error) : 'connection closed'));
      await this.handlers.up(model, node, this.nodeIndex);
    } catch (error) {
      if (this.lifecycle.state === 'up' && this.lifecycle.model === model) this.lifecycle = { state: 'connecting' };
      await model.close().catch(() => {});
      throw amqpReplyCode(error) === null && closedBy !== null ? closedBy : error;
    }
  }

  /** The connection went away: tell the source, then reconnect to the next node unless stopping. */
  private lost(model: ChannelModel, reason: string): void {
    const lifecycle = this.lifecycle;
    const current = lifecycle.state === 'up' || lifecycle.state === 'stopping' ? lifecycle.model : null;
    if (current !== model) return;
    const node = lifecycle.state === 'up' ? lifecycle.node : null;
    this.handlers.down(reason);
    if (lifecycle.state !== 'up') {
      this.lifecycle = { state: 'stopping', model: null, node: null };
      return;
    }
    // The node may be gone for good: the reconnect starts at the next one (the same one when there is only one).
    this.nodeIndex = nextNodeIndex(this.nodeIndex, this.options.nodes.length);
    this.log.warn(
      { reason, url: node === null ? null : redactUrl(node), next: redactUrl(this.options.nodes[this.nodeIndex]!) },
      'amqp link lost; reconnecting',
    );
    void this.connectUntilUp().catch((error) => {
      this.log.fatal({ err: describeError(error) }, 'amqp reconnect gave up');
      process.exitCode = 1;
    });
  }

  /** The connection is lost as far as the source can tell (a channel it cannot do without died): close it, and reconnect. */
  drop(reason: string): void {
    const model = this.model;
    if (model === null) return;
    this.lost(model, reason);
    void model.close().catch(() => {});
  }

  /**
   * Memory and disk alarms: RabbitMQ stops reading from a connection that
   * publishes, so dead-letter copies wait (their originals stay unacked).
   * Consuming and acking go on. Logged, and shown in status and /readyz.
   */
  private watchAlarms(model: ChannelModel): void {
    this.blocked = null;
    model.on('blocked', (reason: string) => {
      this.blocked = { reason: String(reason), since: new Date() };
      this.log.warn({ reason: String(reason) }, 'amqp connection blocked by the broker (resource alarm): dead-letter publishes wait until it clears');
    });
    model.on('unblocked', () => {
      const since = this.blocked?.since;
      this.blocked = null;
      this.log.info({ blockedMs: since ? Date.now() - since.getTime() : null }, 'amqp connection unblocked');
    });
  }

  /**
   * Closes the connection, waiting at most `timeoutMs` for the broker; a
   * broker that does not answer gets its socket destroyed. Safe twice.
   */
  async close(timeoutMs: number): Promise<void> {
    const model = this.model;
    if (this.lifecycle.state === 'closed') return;
    this.lifecycle = { state: 'closed' };
    if (model === null) return;
    const closed = await within(
      timeoutMs,
      model.close().catch((error: unknown) => this.log.debug({ err: describeError(error) }, 'closing the amqp connection failed')),
    );
    if (closed === TIMED_OUT) {
      this.log.warn({ timeoutMs }, 'the broker did not confirm the connection close in time; dropping the socket');
      (model.connection as unknown as { stream?: { destroy(): void } }).stream?.destroy();
    }
  }
}
