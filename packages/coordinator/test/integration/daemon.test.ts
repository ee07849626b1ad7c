/**
 * The Daemon in-process: its real Redis edge, fleet and counters against the
 * local Redis, with a fake broker (the message source) and fake worker
 * threads in place of the two edges a process would need
 * (process/start-context.ts ReplaceableEdges). Every lifecycle rule of
 * daemon.ts runs here without spawning main.js: the transitions, the order
 * of a stop, a failed start closing what it opened, a stop during a start.
 */
import { expect } from 'chai';
import type { Channel, ConsumeMessage } from 'amqplib';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { decodeBatchTask, layoutKey, loadConfig, PART_NEW, TallyError, type BatchResult, type WireBatchTask } from '@tally/shared';
import { deleteKeys } from '@tally/testkit';
import type { AmqpBrokerState, MessageSource, SourceHandlers } from '../../src/amqp/message-source.js';
import { Daemon } from '../../src/daemon.js';
import type { ChannelLink } from '../../src/pipeline/delivery.js';
import type { StartContext, Threads } from '../../src/process/start-context.js';
import { REDIS_URL, uniqueName } from './harness.js';

interface LogRecord {
  readonly msg: string;
  readonly from?: string;
  readonly state?: string;
  readonly [field: string]: unknown;
}

/** A logger whose records the test reads. */
function recordingLogger(): { log: pino.Logger; records: LogRecord[] } {
  const records: LogRecord[] = [];
  const log = pino({ level: 'info' }, { write: (line: string) => records.push(JSON.parse(line) as LogRecord) });
  return { log, records };
}

/** The transitions the daemon logged, as "from→to". */
function transitions(records: readonly LogRecord[]): string[] {
  return records.filter((r) => r.from !== undefined && r.state !== undefined).map((r) => `${r.from}→${r.state}`);
}

/** What happened to the fakes, in order: the close steps among them. */
type Journal = string[];

/** The broker: one channel; deliveries pushed by the test; acks and dead letters recorded. */
class FakeSource implements MessageSource {
  readonly acks: Array<{ tag: number; multiple: boolean }> = [];
  readonly deadLetters: string[] = [];
  consuming = false;
  closing = false;
  /** What start() does: resolve (connected and consuming) unless the test replaces it. */
  starting: () => Promise<void> = () => Promise.resolve();
  private readonly link: ChannelLink = { generation: 1, channel: {} as Channel, alive: true };
  private nextTag = 1;

  constructor(
    private readonly handlers: SourceHandlers,
    private readonly journal: Journal,
  ) {}

  async start(): Promise<void> {
    this.journal.push('source start');
    await this.starting();
    this.handlers.onLinkUp(this.link);
    this.consuming = true;
  }

  /** A delivery from the broker: the contract's body. */
  deliver(id: string | undefined, changes: ReadonlyArray<{ sku: string; delta: number }>): number {
    const tag = this.nextTag++;
    const message = {
      content: Buffer.from(JSON.stringify({ id, changes })),
      fields: { deliveryTag: tag, redelivered: false, consumerTag: 'fake', exchange: '', routingKey: 'fake' },
      properties: { headers: {} },
    } as unknown as ConsumeMessage;
    this.handlers.onDelivery(this.link, message);
    return tag;
  }

  /** The highest tag acked so far, by multiple-acks. */
  get ackedUpTo(): number {
    return Math.max(0, ...this.acks.filter((a) => a.multiple).map((a) => a.tag));
  }

  ack(_link: ChannelLink, tag: number, multiple: boolean): void {
    this.acks.push({ tag, multiple });
  }

  deadLetter(_link: ChannelLink, message: ConsumeMessage, reason: string): Promise<void> {
    this.deadLetters.push(`${message.fields.deliveryTag}:${reason}`);
    return Promise.resolve();
  }

  stopConsuming(): Promise<void> {
    this.journal.push('source stop consuming');
    this.consuming = false;
    return Promise.resolve();
  }

  close(): Promise<void> {
    this.journal.push('source close');
    this.closing = true;
    this.link.alive = false;
    this.handlers.onLinkDown(this.link, 'closed');
    return Promise.resolve();
  }

  get connected(): boolean {
    return this.link.alive;
  }
  readonly node = 'fake://broker';
  readonly brokerState: AmqpBrokerState = { blocked: false, blockedReason: null, blockedSince: null, unroutableDeadLetters: 0 };
  readonly partitionsHeld: number[] = [];
  assign(): void {}
  checkIdlePartitions(): Promise<void> {
    return Promise.resolve();
  }
}

/** The worker threads: every part is new; the changes each run was given are summed per SKU. */
class FakeThreads implements Threads {
  readonly counts = new Map<string, number>();
  batches = 0;
  stopped = false;

  constructor(private readonly journal: Journal) {}

  warm(): Promise<void> {
    this.journal.push('threads warm');
    return Promise.resolve();
  }

  run(wire: WireBatchTask): Promise<BatchResult> {
    const task = decodeBatchTask(wire);
    this.batches++;
    for (const part of task.changes) for (const [sku, delta] of part) this.counts.set(sku, (this.counts.get(sku) ?? 0) + Number(delta));
    return Promise.resolve({
      vshard: task.vshard,
      marked: new Uint8Array(task.changes.length).fill(PART_NEW),
      writeRetries: 0,
      occupationFailures: 0,
      waitTimeouts: 0,
      refusals: [],
      claimTakeovers: 0,
      timings: { precheckMs: 0, writeMs: 0, occupyMs: 0 },
    });
  }
}

interface Harness {
  readonly daemon: Daemon;
  readonly records: LogRecord[];
  readonly journal: Journal;
  /** Set once the daemon opened them (a start refused earlier opens neither). */
  source: FakeSource | null;
  threads: FakeThreads | null;
  readonly prefix: string;
}

const redis = new Redis(REDIS_URL);
const prefixes: string[] = [];

after(async () => {
  for (const prefix of prefixes) await deleteKeys(REDIS_URL, prefix);
  redis.disconnect();
});

function harness(configure: (source: FakeSource) => void = () => {}, env: Record<string, string> = {}): Harness {
  const name = uniqueName('daemon');
  const prefix = `${name}:`;
  prefixes.push(prefix);
  const config = loadConfig({
    TALLY_QUEUE: name,
    TALLY_PREFIX: prefix,
    TALLY_REDIS_URL: REDIS_URL,
    TALLY_WORKERS: '2',
    TALLY_VIRTUAL_SHARDS: '8',
    TALLY_BATCH_WAIT_MS: '5',
    TALLY_SHUTDOWN_GRACE_MS: '2000',
    TALLY_HEARTBEAT_MS: '200',
    ...env,
  });
  const { log, records } = recordingLogger();
  const journal: Journal = [];
  const h: Harness = { daemon: null as unknown as Daemon, records, journal, source: null, threads: null, prefix };
  const daemon = new Daemon(config, log, {
    edges: {
      openThreads: (context: StartContext) => {
        const threads = new FakeThreads(journal);
        h.threads = threads;
        context.closeSteps.add({
          name: 'stopping worker threads',
          run: () => {
            threads.stopped = true;
            journal.push('threads stop');
          },
        });
        return threads;
      },
      openSource: (context: StartContext, handlers: SourceHandlers) => {
        const source = new FakeSource(handlers, journal);
        configure(source);
        h.source = source;
        context.closeSteps.add({ name: 'closing amqp', run: () => source.close() });
        return source;
      },
    },
  });
  (h as { daemon: Daemon }).daemon = daemon;
  return h;
}

async function waitFor(condition: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition()) {
    if (performance.now() > deadline) expect.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Heartbeat keys of a prefix: a running daemon has one, a stopped one none. */
async function heartbeats(prefix: string): Promise<string[]> {
  return redis.keys(`${prefix}daemon:*`);
}

describe('the Daemon in-process (real Redis, fake broker and threads)', function () {
  this.timeout(30_000);

  it('starts, counts deliveries through the pipeline, acks them, and stops in order: created→starting→running→stopping→stopped', async () => {
    const h = harness();
    const { daemon } = h;
    expect(daemon.status.state).to.equal('created');
    await daemon.start();
    expect(daemon.status.state).to.equal('running');
    expect(daemon.status.consuming, 'consuming once started').to.equal(true);
    expect(daemon.ready, JSON.stringify(daemon.readiness)).to.equal(true);
    expect(await heartbeats(h.prefix), 'one heartbeat while running').to.have.length(1);

    const source = h.source!;
    const expected = new Map<string, number>();
    let last = 0;
    for (let i = 0; i < 200; i++) {
      const changes = [
        { sku: `sku-${i % 17}`, delta: 1 + (i % 3) },
        { sku: `sku-${(i * 7) % 23}`, delta: -1 },
      ];
      for (const { sku, delta } of changes) expected.set(sku, (expected.get(sku) ?? 0) + delta);
      last = source.deliver(`m-${i}`, changes);
    }
    const bad = source.deliver(undefined, [{ sku: 'x', delta: 1 }]); // no id: dead-lettered, never counted
    await waitFor(() => source.ackedUpTo >= bad, 'every delivery acked');
    expect(source.ackedUpTo).to.equal(last + 1);
    expect(source.deadLetters.map((reason) => reason.split(':').slice(0, 2).join(':'))).to.deep.equal([`${bad}:missing-id`]);
    expect(Object.fromEntries(h.threads!.counts), 'what the threads were given, per SKU').to.deep.equal(Object.fromEntries(expected));

    await daemon.stop();
    expect(daemon.status.state).to.equal('stopped');
    expect(transitions(h.records)).to.deep.equal(['created→starting', 'starting→running', 'running→stopping', 'stopping→stopped']);
    // The stop's order: no new deliveries first, the threads before the channel (CLOSE_ORDER).
    expect(h.journal).to.deep.equal(['threads warm', 'source start', 'source stop consuming', 'threads stop', 'source close']);
    const stopped = h.records.find((r) => r.msg === 'stopped' && r.state === 'stopped')!;
    expect(stopped.counters, 'what this run added').to.include({ received: 201, counted: 200, dead_lettered: 1 });
    expect(await heartbeats(h.prefix), 'the heartbeat key is deleted on a clean stop').to.deep.equal([]);
    await daemon.stop(); // a second stop is a no-op
    expect(transitions(h.records)).to.have.length(4);
  });

  it('a start that fails at the broker closes what it opened and rejects: created→starting→stopped', async () => {
    const refusal = new TallyError('TALLY_AMQP_REFUSED', 'fake refusal: the broker says no');
    const h = harness((source) => {
      source.starting = () => Promise.reject(refusal);
    });
    let thrown: unknown = null;
    await h.daemon.start().catch((error: unknown) => (thrown = error));
    expect(thrown).to.equal(refusal);
    expect(h.daemon.status.state).to.equal('stopped');
    expect(transitions(h.records)).to.deep.equal(['created→starting', 'starting→stopped']);
    // Threads opened and warmed before the source: both closed, threads first.
    expect(h.journal).to.deep.equal(['threads warm', 'source start', 'threads stop', 'source close']);
    expect(h.threads!.stopped).to.equal(true);
    expect(await heartbeats(h.prefix), 'the heartbeat it had started is gone').to.deep.equal([]);
  });

  it('a start refused by the layout check opens no thread and no source', async () => {
    const h = harness();
    // The prefix was laid out with another number of virtual shards: invariant 3 refuses the start.
    await redis.hset(layoutKey(h.prefix), 'virtual_shards', '4', 'hash', 'fnv1a32-utf8', 'created_at', new Date().toISOString());
    let thrown: unknown = null;
    await h.daemon.start().catch((error: unknown) => (thrown = error));
    expect((thrown as TallyError | null)?.code).to.equal('TALLY_SHARD_LAYOUT_MISMATCH');
    expect(h.threads, 'no thread opened').to.equal(null);
    expect(h.source, 'no source opened').to.equal(null);
    expect(transitions(h.records)).to.deep.equal(['created→starting', 'starting→stopped']);
    expect(await heartbeats(h.prefix)).to.deep.equal([]);
  });

  it('a stop during the start ends the start without running: created→starting→stopping→stopped', async () => {
    let release!: () => void;
    const h = harness((source) => {
      source.starting = () => new Promise<void>((resolve) => (release = resolve));
    });
    const started = h.daemon.start();
    await waitFor(() => h.journal.includes('source start'), 'the source to be starting');
    const stopped = h.daemon.stop();
    release();
    await started; // resolves, without running
    await stopped;
    expect(h.daemon.status.state).to.equal('stopped');
    expect(transitions(h.records)).to.deep.equal(['created→starting', 'starting→stopping', 'stopping→stopped']);
    expect(h.journal.slice(-2)).to.deep.equal(['threads stop', 'source close']);
  });

  it('refuses a second start, in any state', async () => {
    const h = harness();
    await h.daemon.start();
    let thrown: unknown = null;
    await h.daemon.start().catch((error: unknown) => (thrown = error));
    expect(String(thrown)).to.match(/start\(\) called in state running/);
    await h.daemon.stop();
  });
});
