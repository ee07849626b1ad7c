/**
 * A client of the primary behind Sentinel that comes back from the one end
 * ioredis never recovers from.
 *
 * ioredis ends a client for good, with no reconnect, when its connector
 * rejects a connect. Behind Sentinel one race does that: the primary dies,
 * the client reconnects and asks a Sentinel for the primary, and while that
 * question is in flight the failover detector of the connection that died
 * hears `+switch-master` and disconnects the connector, which then rejects
 * its own connect. From there every command fails "Connection is closed."
 * and nothing reconnects (ioredis issue 1683). A CI run under load hit it in
 * the daemon's worker threads: four minutes of retries against a client that
 * would never come back. The failover detector itself is worth keeping (it
 * moves a client off an old primary that is still up), so the end is undone
 * instead.
 *
 * An end the owner did not ask for is read as one more failed connect and
 * retried with the client's own retryStrategy. The owner's ends stay ends:
 * disconnect() and quit() (both marked here), and a retryStrategy that
 * gives up (it ends through a close, which the race never does).
 */
import { Redis, type Callback, type Command, type RedisOptions } from 'ioredis';
import type { WriteableStream } from 'ioredis/built/types.js';

/** Emitted with the delay before the client reconnects after an end its owner did not ask for. */
export const REVIVING = 'reviving';

/** What the owner logs on REVIVING. */
export const REVIVING_MESSAGE = 'redis client ended while asking the Sentinels for the primary (a failover heard mid-connect); reconnecting';

export class SentinelPrimaryClient extends Redis {
  private closedByOwner = false;
  private closedBeforeEnd = false;
  private revivals = 0;
  private reviveTimer: NodeJS.Timeout | null = null;

  constructor(options: RedisOptions) {
    super(options);
    this.on('close', () => {
      this.closedBeforeEnd = true;
    });
    this.on('connecting', () => {
      this.closedBeforeEnd = false;
    });
    this.on('ready', () => {
      this.revivals = 0;
    });
    this.on('end', () => this.reviveUnlessOwned());
  }

  // The owner's connect after its own disconnect: from here an end it did not ask for is revived again.
  override connect(callback?: Callback<void>): Promise<void> {
    if (this.status === 'end' || this.status === 'wait') this.closedByOwner = false;
    return super.connect(callback);
  }

  override disconnect(reconnect = false): void {
    if (!reconnect) this.ownerCloses();
    super.disconnect(reconnect);
  }

  // QUIT while a revival is pending: ioredis rejects it (the client has ended), and the revival must not follow.
  override sendCommand(command: Command, stream?: WriteableStream): unknown {
    if (command.name === 'quit') this.ownerCloses();
    return super.sendCommand(command, stream);
  }

  private ownerCloses(): void {
    this.closedByOwner = true;
    if (this.reviveTimer !== null) clearTimeout(this.reviveTimer);
    this.reviveTimer = null;
  }

  private reviveUnlessOwned(): void {
    if (this.closedByOwner || this.closedBeforeEnd) return;
    const delay = this.options.retryStrategy?.(++this.revivals);
    // A one-shot client (the CLI, the probe) gives up on its first failure, as it would without this.
    if (typeof delay !== 'number') return;
    this.emit(REVIVING, delay);
    this.reviveTimer = setTimeout(() => {
      this.reviveTimer = null;
      if (!this.closedByOwner && this.status === 'end') this.connect().catch(() => {});
    }, delay);
  }
}
