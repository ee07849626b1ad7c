/**
 * Asking the Sentinels about the master Tally writes to: `SENTINEL MASTER
 * <name>` (its address, its flags, its replicas). The start-up probe asks
 * once, to refuse a wrong master name or Sentinel password with a line that
 * names it (ioredis would only say "All sentinels are unreachable"); the
 * daemon's watch asks every second; `tally status` once.
 *
 * A reader keeps one connection, to the Sentinel that answered last, and
 * moves to the next one in the list when it fails: the Sentinels are each
 * other's backups, and one answer is enough (after a switch they all name
 * the new primary within a second or so).
 */
import type { ConnectionOptions } from 'node:tls';
import { Redis } from 'ioredis';
import {
  classifyRedisFailure,
  describeError,
  joinAddress,
  RedisRequirementError,
  sentinelMasterFromReply,
  type RedisFailure,
  type SentinelAddress,
  type SentinelMasterInfo,
  type SentinelTarget,
} from '@tally/shared';

export interface SentinelAnswer {
  /** The Sentinel that answered, `host:port`. */
  readonly sentinel: string;
  readonly master: SentinelMasterInfo;
}

export interface SentinelReaderOptions {
  /** Per connect and per command. */
  readonly timeoutMs?: number;
  /** A CA for rediss+sentinel:// (tests); the process's trust store otherwise. */
  readonly tls?: ConnectionOptions;
}

/** What one Sentinel said when it did not name the master. */
interface Refusal {
  readonly sentinel: string;
  readonly error: unknown;
}

export class SentinelReader {
  private client: Redis | null = null;
  /** Index in target.sentinels of the Sentinel `client` talks to, and where the next attempt starts. */
  private current = 0;
  private closed = false;
  /** The last 'error' event of `client`: why a connection failed. */
  private connectionError: unknown = null;

  constructor(
    private readonly target: SentinelTarget,
    private readonly options: SentinelReaderOptions = {},
  ) {}

  /**
   * The master as the first Sentinel that knows it says. Throws
   * RedisRequirementError when every Sentinel that answered refused the
   * credentials or does not monitor the name (configuration), a plain Error
   * when none answered (an outage).
   */
  async read(): Promise<SentinelAnswer> {
    const refusals: Refusal[] = [];
    const count = this.target.sentinels.length;
    const start = this.current;
    for (let tried = 0; tried < count && !this.closed; tried++) {
      const index = (start + tried) % count;
      const address = this.target.sentinels[index]!;
      try {
        const client = this.clientFor(index, address);
        const reply = await client.call('SENTINEL', 'MASTER', this.target.masterName);
        this.current = index;
        return { sentinel: joinAddress(address.host, address.port), master: sentinelMasterFromReply(reply) };
      } catch (error) {
        // "Connection is closed" says nothing: the connection's own error (ECONNREFUSED, a TLS failure) says why.
        const cause = this.connectionError ?? error;
        this.dropClient();
        refusals.push({ sentinel: joinAddress(address.host, address.port), error: cause });
      }
    }
    throw this.explain(refusals);
  }

  close(): void {
    this.closed = true;
    this.dropClient();
  }

  private clientFor(index: number, address: SentinelAddress): Redis {
    if (this.client !== null && this.current === index) return this.client;
    this.dropClient();
    this.current = index;
    const timeoutMs = this.options.timeoutMs ?? 2_000;
    const client = new Redis({
      host: address.host,
      port: address.port,
      ...(this.target.sentinelUsername === null ? {} : { username: this.target.sentinelUsername }),
      ...(this.target.sentinelPassword === null ? {} : { password: this.target.sentinelPassword }),
      ...(this.target.tls ? { tls: this.options.tls ?? {} } : {}),
      connectionName: 'tally-sentinel-watch',
      // A Sentinel has no INFO keyspace to be ready on, and a failed one is replaced by the next, not reconnected.
      enableReadyCheck: false,
      retryStrategy: () => null,
      maxRetriesPerRequest: 0,
      connectTimeout: timeoutMs,
      commandTimeout: timeoutMs,
    });
    this.connectionError = null;
    client.on('error', (error: unknown) => {
      this.connectionError = error;
    });
    this.client = client;
    return client;
  }

  private dropClient(): void {
    this.client?.disconnect();
    this.client = null;
  }

  private explain(refusals: readonly Refusal[]): Error {
    const said = refusals.map(({ sentinel, error }) => `${sentinel}: ${describeError(error)}`).join('; ');
    const problems = refusals.map(({ error }) => classifyRedisFailure(error as RedisFailure, 'SENTINEL MASTER'));
    const unknown = refusals.filter(({ error }) => /no such master/i.test(describeError(error)));
    if (refusals.length > 0 && unknown.length === refusals.length) {
      return new RedisRequirementError(
        'TALLY_REDIS_SENTINEL',
        `no Sentinel of TALLY_REDIS_URL monitors a master named ${JSON.stringify(this.target.masterName)} (${said}); ` +
          'name the master as in the Sentinels\' "sentinel monitor <name> …" line',
      );
    }
    const auth = problems.find((problem) => problem?.code === 'TALLY_REDIS_AUTH');
    if (auth !== undefined && problems.every((problem) => problem !== null)) {
      return new RedisRequirementError(
        'TALLY_REDIS_AUTH',
        `the Sentinels refused the credentials (${said}); put the Sentinels' password in TALLY_REDIS_URL's sentinelPassword parameter ` +
          "(redis+sentinel://host:26379/master?sentinelPassword=…), the data nodes' in its user:password",
      );
    }
    const tls = problems.find((problem) => problem?.code === 'TALLY_REDIS_TLS');
    if (tls && problems.every((problem) => problem !== null)) return new RedisRequirementError('TALLY_REDIS_TLS', `Sentinel: ${tls.message}`);
    return new Error(refusals.length === 0 ? 'the Sentinel reader is closed' : `no Sentinel answers (${said})`);
  }
}

/** One answer, then the connection is closed: the probe and `tally status`. */
export async function askSentinels(target: SentinelTarget, options: SentinelReaderOptions = {}): Promise<SentinelAnswer> {
  const reader = new SentinelReader(target, options);
  try {
    return await reader.read();
  } finally {
    reader.close();
  }
}
