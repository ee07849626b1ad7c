/**
 * The delivery rules, in-process: the pipeline with a fake thread, a fake
 * channel, fake counters and a fake clock. Each test names the rule it
 * guards; the broker-side facts behind them (an ack naming an acked tag
 * closes the channel) are checked against RabbitMQ in stalled-head.test.ts.
 */
import { expect } from 'chai';
import type { Channel, ConsumeMessage } from 'amqplib';
import { pino } from 'pino';
import {
  ClassifiedFailure,
  COUNT_REFUSED,
  decodeBatchTask,
  markerDigest,
  markerShardOf,
  PART_DONE,
  PART_HELD,
  PART_NEW,
  shardOf,
  type BatchResult,
  type BatchTask,
  type CounterName,
  type WireBatchTask,
} from '@tally/shared';
import { seededRandom } from '@tally/workload';
import type { BugHandler } from '../../src/process/bug-exit.js';
import type { ChannelLink } from '../../src/pipeline/delivery.js';
import { DeliveryPipeline, type PipelineOptions } from '../../src/pipeline/delivery-pipeline.js';
import type { Acker, BatchRunner, Clock, DeadLetterPublisher, Exposure } from '../../src/pipeline/ports.js';

const VSHARDS = 4;
const STALL_MS = 1_000;

const OPTIONS: PipelineOptions = {
  queue: 'unit.pipeline',
  mode: 'two-step',
  virtualShards: VSHARDS,
  acceptTypes: null,
  maxMessageBytes: 65_536,
  prefetch: 1_000,
  stallMs: STALL_MS,
  batchSize: 100,
  batchMaxChanges: 10_000,
  batchWaitMs: 2,
  recordedMarkerScope: 'part',
  claimRetryMs: 5,
  backoff: { baseMs: 1, capMs: 2 },
};

const silent = pino({ level: 'silent' });
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

async function waitFor(condition: () => boolean, what: string, timeoutMs = 3_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition()) {
    if (performance.now() > deadline) expect.fail(`timed out waiting for ${what}`);
    await sleep(1);
  }
}

/** A SKU on the given virtual shard, so a test decides which lane each delivery uses. */
function skuOn(vshard: number, salt = 0): string {
  for (let i = 0; ; i++) {
    const sku = `sku-${salt}-${i}`;
    if (shardOf(sku, VSHARDS) === vshard) return sku;
  }
}

/** One channel generation; `alive` goes false when the test drops it. */
function channel(generation: number): ChannelLink {
  return { generation, channel: {} as Channel, alive: true };
}

/** Ids do not cross the thread boundary, digests do: the fake thread finds each part's id by its digest. */
const idOfDigest = new Map<string, string>();

function message(tag: number, id: string, skus: readonly string[]): ConsumeMessage {
  idOfDigest.set(markerDigest(id).toString('hex'), id);
  const body = JSON.stringify({ id, changes: skus.map((sku) => ({ sku, delta: 1 })) });
  return {
    content: Buffer.from(body),
    fields: { deliveryTag: tag, redelivered: false, consumerTag: 'c', exchange: '', routingKey: OPTIONS.queue },
    properties: { headers: {} },
  } as unknown as ConsumeMessage;
}

function result(task: BatchTask, marked: (index: number) => number, refusals: BatchResult['refusals'] = []): BatchResult {
  return {
    vshard: task.vshard,
    marked: Uint8Array.from({ length: task.changes.length }, (_, i) => marked(i)),
    writeRetries: 0,
    occupationFailures: 0,
    waitTimeouts: 0,
    refusals,
    claimTakeovers: 0,
    timings: { precheckMs: 0, writeMs: 0, occupyMs: 0 },
  };
}

/** One run of a task on the fake thread: what it was sent, and how the test answers it. */
interface Run {
  readonly task: BatchTask & { readonly ids: readonly string[] };
  resolve(result: BatchResult): void;
  reject(error: unknown): void;
}

/**
 * The worker thread. By default every part is new and the run answers at
 * once; `respond` changes that (hold a run, fail it, mark parts).
 */
class FakeThread implements BatchRunner {
  readonly runs: Run[] = [];
  stopped = false;
  respond: (run: Run) => void = (run) => run.resolve(result(run.task, () => PART_NEW));
  /** `<id>|<vshard>`: parts answered written or marked, as the thread answered (not held, not refused). */
  readonly settledParts = new Set<string>();
  /** Ids with a part Redis refused: such a message is done only once its dead letter is confirmed. */
  readonly refusedIds = new Set<string>();

  run(wire: WireBatchTask): Promise<BatchResult> {
    const decoded = decodeBatchTask(wire);
    const task: BatchTask & { ids: string[] } = { ...decoded, ids: decoded.digests!.map((digest) => idOfDigest.get(Buffer.from(digest).toString('hex'))!) };
    return new Promise((resolve, reject) => {
      const run = {
        task,
        resolve: (answer: BatchResult) => {
          // Recorded when the thread answers, before the pipeline reads the answer.
          const refused = new Set(answer.refusals.map((refusal) => refusal.part));
          task.ids.forEach((id, part) => {
            if (refused.has(part)) this.refusedIds.add(id);
            else if (answer.marked[part] !== PART_HELD) this.settledParts.add(`${id}|${task.vshard}`);
          });
          resolve(answer);
        },
        reject,
      };
      this.runs.push(run);
      this.respond(run);
    });
  }

  /** The message ids the thread was given, in order, over every run. */
  get ids(): string[] {
    return this.runs.flatMap((run) => run.task.ids);
  }
}

/**
 * The channel's acks, checked as RabbitMQ would (invariant 7): a tag acked
 * twice, or an ack naming a tag already acked, closes the channel; a
 * multiple-ack acks every outstanding tag up to it, each of which must be
 * finished. Tags are a channel generation's own.
 */
class FakeChannelAcks implements Acker {
  readonly acks: Array<{ tag: number; multiple: boolean; generation: number }> = [];
  /** The tags acked (on any generation: the tests that look at it use one). */
  readonly acked = new Set<number>();
  private readonly ackedOn = new Map<number, Set<number>>();
  readonly violations: string[] = [];
  /** Whether a delivery is finished, by generation and tag: setUp gives the real one (finishedOracle). */
  finished: (tag: number, generation: number) => boolean = () => {
    throw new Error('no finished oracle');
  };

  ack(link: ChannelLink, upTo: number, multiple: boolean): void {
    this.acks.push({ tag: upTo, multiple, generation: link.generation });
    const acked = this.ackedOn.get(link.generation) ?? new Set<number>();
    this.ackedOn.set(link.generation, acked);
    if (acked.has(upTo)) this.violations.push(`tag ${upTo} acked twice`);
    const covered = multiple ? Array.from({ length: upTo }, (_, i) => i + 1).filter((tag) => !acked.has(tag)) : [upTo];
    for (const tag of covered) {
      if (!this.finished(tag, link.generation)) this.violations.push(`tag ${tag} acked before it finished`);
      acked.add(tag);
      this.acked.add(tag);
    }
  }
}

class FakeDeadLetters implements DeadLetterPublisher {
  readonly published: Array<{ tag: number; reason: string }> = [];
  /** `<generation>:<tag>` of the dead letters the broker confirmed. */
  readonly confirmed = new Set<string>();
  confirm: () => Promise<void> = () => Promise.resolve();

  deadLetter(link: ChannelLink, message: ConsumeMessage, reason: string): Promise<void> {
    this.published.push({ tag: message.fields.deliveryTag, reason });
    // Recorded before the pipeline's own continuation runs: it is chained on the promise returned here.
    return this.confirm().then(() => void this.confirmed.add(`${link.generation}:${message.fields.deliveryTag}`));
  }
}

class FakeClock implements Clock {
  private ms = 1_000_000;
  now(): number {
    return this.ms;
  }
  epochMs(): number {
    return 1_700_000_000_000 + this.ms;
  }
  advance(ms: number): void {
    this.ms += ms;
  }
}

const NO_EXPOSURE: Exposure = {
  channelChanged: () => {},
  channelClosed: () => {},
  batchReturned: () => {},
  batchDone: () => {},
  occupied: () => {},
  acked: () => {},
  ackedOne: () => {},
};

function setUp(options: Partial<PipelineOptions> = {}, onBug?: BugHandler) {
  const thread = new FakeThread();
  const acks = new FakeChannelAcks();
  const deadLetters = new FakeDeadLetters();
  const clock = new FakeClock();
  const counters = new Map<CounterName, number>();
  const pipeline = new DeliveryPipeline(
    { ...OPTIONS, ...options },
    {
      runner: thread,
      acker: acks,
      deadLetters,
      counters: { add: (name, amount = 1) => void counters.set(name, (counters.get(name) ?? 0) + amount) },
      exposure: NO_EXPOSURE,
      clock,
      log: silent,
      ...(onBug === undefined ? {} : { onBug }),
    },
  );
  // The ground truth the fake channel checks acks against: a delivery is finished only once every part of it was
  // answered by the thread as written or marked (a copy in flight: once the first's were), or its dead letter confirmed.
  const scope = options.recordedMarkerScope ?? OPTIONS.recordedMarkerScope;
  const partsOf = new Map<string, { id: string; shards: number[] }>();
  acks.finished = (tag, generation) => {
    const key = `${generation}:${tag}`;
    if (deadLetters.confirmed.has(key)) return true;
    const delivery = partsOf.get(key);
    if (delivery === undefined || delivery.shards.length === 0 || thread.refusedIds.has(delivery.id)) return false;
    return delivery.shards.every((vshard) => thread.settledParts.has(`${delivery.id}|${vshard}`));
  };
  const accept = (on: ChannelLink, delivered: ConsumeMessage): void => {
    let parts: { id: string; shards: number[] } | undefined;
    try {
      const body = JSON.parse(delivered.content.toString()) as { id?: unknown; changes?: Array<{ sku: string; delta: number }> };
      if (typeof body.id === 'string' && Array.isArray(body.changes)) {
        const skus = body.changes.filter((change) => change.delta !== 0).map((change) => change.sku);
        const shards = scope === 'message' ? [markerShardOf(markerDigest(body.id), VSHARDS)] : [...new Set(skus.map((sku) => shardOf(sku, VSHARDS)))];
        parts = { id: body.id, shards };
      }
    } catch {
      // Not JSON: no part, finished only by its dead letter.
    }
    if (parts !== undefined) partsOf.set(`${on.generation}:${delivered.fields.deliveryTag}`, parts);
    pipeline.accept(on, delivered);
  };
  const link = channel(1);
  pipeline.channelUp(link);
  let tag = 0;
  const deliver = (id: string, skus: readonly string[], on: ChannelLink = link): number => {
    accept(on, message(++tag, id, skus));
    return tag;
  };
  const count = (name: CounterName) => counters.get(name) ?? 0;
  return { pipeline, thread, acks, deadLetters, clock, link, accept, deliver, count };
}

describe('DeliveryPipeline', () => {
  it('counts new messages and acks each tag once', async () => {
    const { thread, acks, deliver, count } = setUp();
    // Each shard answers at its own moment, so a message's two parts are done at different times.
    thread.respond = (run) => void setTimeout(() => run.resolve(result(run.task, () => PART_NEW)), 5 * run.task.vshard);
    for (let i = 0; i < 6; i++) deliver(`m${i}`, [skuOn(i % VSHARDS), skuOn((i + 1) % VSHARDS, 1)]);
    await waitFor(() => acks.acked.size === 6, 'six acks');
    expect([...acks.acked].sort(), 'tags 1 to 6').to.deep.equal([1, 2, 3, 4, 5, 6]);
    expect(count('received')).to.equal(6);
    expect(count('counted')).to.equal(6);
    // Acked only once both parts were answered (the fake channel's oracle), never twice.
    expect(acks.violations).to.deep.equal([]);
    // Two parts per message, each sent on its own SKU's shard: message i on shards i and i+1 (mod 4).
    const sent = thread.runs.flatMap((run) => run.task.ids.map((id) => `${id}@${run.task.vshard}`)).sort();
    const expected = Array.from({ length: 6 }, (_, i) => [`m${i}@${i % VSHARDS}`, `m${i}@${(i + 1) % VSHARDS}`])
      .flat()
      .sort();
    expect(sent).to.deep.equal(expected);
  });

  it('holds a second delivery of an id in flight and settles it as a duplicate when the first is done (invariant 4)', async () => {
    const { thread, acks, deliver, count } = setUp();
    const held: Run[] = [];
    thread.respond = (run) => held.push(run);
    deliver('same', [skuOn(0)]);
    deliver('same', [skuOn(0)]);
    await waitFor(() => held.length === 1, 'the first batch');
    await sleep(10); // the lane's batch timer has long run: the copy would be in a batch by now
    expect(thread.ids).to.deep.equal(['same']);
    expect(acks.acks).to.deep.equal([]);
    held[0]!.resolve(result(held[0]!.task, () => PART_NEW));
    await waitFor(() => acks.acked.size === 2, 'both acked');
    expect(thread.ids, 'the copy never reached a thread').to.deep.equal(['same']);
    expect(count('counted')).to.equal(1);
    expect(count('duplicates')).to.equal(1);
    expect(acks.violations).to.deep.equal([]);
  });

  it('counts a redelivery of an id once the first is settled: found marked, a duplicate', async () => {
    const { thread, acks, deliver, count } = setUp();
    deliver('again', [skuOn(1)]);
    await waitFor(() => acks.acked.size === 1, 'the first');
    thread.respond = (run) => run.resolve(result(run.task, () => PART_DONE));
    deliver('again', [skuOn(1)]);
    await waitFor(() => acks.acked.size === 2, 'the second');
    expect(thread.ids).to.deep.equal(['again', 'again']);
    expect([count('counted'), count('duplicates')]).to.deep.equal([1, 1]);
  });

  it("retries a part held by another daemon's claim, and acks the deliveries behind it meanwhile, one by one", async () => {
    const { thread, acks, deliver, count } = setUp();
    let claimed = true;
    thread.respond = (run) => run.resolve(result(run.task, (i) => (run.task.ids[i] === 'claimed' ? (claimed ? PART_HELD : PART_DONE) : PART_NEW)));
    const head = deliver('claimed', [skuOn(0)]);
    const behind = [deliver('b1', [skuOn(1)]), deliver('b2', [skuOn(2)])];
    await waitFor(() => behind.every((tag) => acks.acked.has(tag)), 'the acks behind the held head');
    expect(acks.acked.has(head)).to.equal(false);
    expect(
      acks.acks.filter((ack) => behind.includes(ack.tag)).every((ack) => !ack.multiple),
      'single acks behind the head',
    ).to.equal(true);
    expect(count('claim_holds')).to.be.at.least(1);
    // The other daemon finished it: the retry finds it marked.
    claimed = false;
    await waitFor(() => acks.acked.has(head), 'the head, once the claim is gone');
    expect(thread.ids.filter((id) => id === 'claimed').length, 'tried again').to.be.at.least(2);
    expect([count('counted'), count('duplicates')]).to.deep.equal([2, 1]);
    expect(acks.violations).to.deep.equal([]);
  });

  it('dead-letters a message whose part Redis refused (count-refused) and acks it only once the dead letter is confirmed', async () => {
    const { thread, acks, deadLetters, deliver, count } = setUp();
    let confirm!: () => void;
    deadLetters.confirm = () => new Promise<void>((resolve) => (confirm = resolve));
    thread.respond = (run) =>
      run.resolve(
        result(
          run.task,
          () => PART_NEW,
          run.task.ids.flatMap((id, part) =>
            id === 'refused' && run.task.vshard === 0 ? [{ part, key: 'tally:c:x', sku: 'x', delta: '1', error: 'WRONGTYPE' }] : [],
          ),
        ),
      );
    const refused = deliver('refused', [skuOn(0), skuOn(1)]);
    const fine = deliver('fine', [skuOn(0)]);
    await waitFor(() => deadLetters.published.length === 1, 'the dead letter');
    expect(deadLetters.published[0]!.tag).to.equal(refused);
    expect(deadLetters.published[0]!.reason).to.match(new RegExp(`^${COUNT_REFUSED}: WRONGTYPE \\(sku "x", key tally:c:x, delta 1\\)$`));
    await nextTurn();
    await nextTurn();
    expect(acks.acked.has(refused), 'not acked before the copy is confirmed').to.equal(false);
    expect(acks.acked.has(fine), 'the next one waits behind it').to.equal(false);
    expect(count('counted'), 'the refused message is not counted').to.equal(1);
    confirm();
    await waitFor(() => acks.acked.has(refused) && acks.acked.has(fine), 'both acked');
    expect(count('dead_lettered')).to.equal(1);
    expect(count('count_errors')).to.equal(1);
  });

  it('never acks a delivery whose dead letter was not confirmed before its channel died', async () => {
    const { pipeline, deadLetters, acks, link, accept, count } = setUp();
    deadLetters.confirm = () => Promise.reject(new Error('not confirmed'));
    // Two bad bodies: each is dead-lettered, and acked only once its copy is confirmed.
    accept(link, { ...message(1, 'x', []), content: Buffer.from('not json') } as ConsumeMessage);
    accept(link, { ...message(2, 'y', []), content: Buffer.from('{"id": 7}') } as ConsumeMessage);
    await waitFor(() => deadLetters.published.length >= 4, 'retried publishes');
    link.alive = false;
    pipeline.channelDown(link);
    await sleep(20);
    expect(acks.acks).to.deep.equal([]);
    expect(count('dead_lettered')).to.equal(0);
    expect(pipeline.drained).to.equal(true);
  });

  it('acks the finished deliveries behind a stalled head one by one after TALLY_STALL_MS, and the head with a multiple-ack once it finishes', async () => {
    const { pipeline, thread, acks, clock, deliver } = setUp();
    const stuck: Run[] = [];
    thread.respond = (run) => (run.task.vshard === 0 ? stuck.push(run) : run.resolve(result(run.task, () => PART_NEW)));
    const head = deliver('stuck', [skuOn(0)]);
    const behind = [deliver('a', [skuOn(1)]), deliver('b', [skuOn(2)]), deliver('c', [skuOn(3)])];
    await waitFor(() => thread.runs.length === 4, 'every batch sent');
    await nextTurn();
    clock.advance(STALL_MS - 1);
    pipeline.sendAcks();
    expect(acks.acks, 'nothing before the threshold: the head blocks the multiple-ack').to.deep.equal([]);
    clock.advance(1);
    pipeline.sendAcks();
    expect(acks.acks).to.deep.equal(behind.map((tag) => ({ tag, multiple: false, generation: 1 })));
    expect(pipeline.oldestUnackedAgeMs()).to.equal(STALL_MS);
    const run = stuck.pop()!;
    run.resolve(result(run.task, () => PART_NEW));
    await waitFor(() => acks.acked.has(head), 'the head');
    // The multiple-ack names the head, the one tag still outstanding: never an acked one.
    expect(acks.acks.at(-1)).to.deep.equal({ tag: head, multiple: true, generation: 1 });
    expect(acks.violations).to.deep.equal([]);
    expect(pipeline.oldestUnackedAgeMs()).to.equal(null);
  });

  it('acks exactly: random shards and completion orders, no tag twice, multiple-acks only over finished tags (invariant 7)', async () => {
    for (let seed = 1; seed <= 20; seed++) {
      const random = seededRandom(seed);
      const { thread, acks, deliver } = setUp({ batchSize: 1 + Math.floor(random() * 4) });
      const open: Run[] = [];
      thread.respond = (run) => open.push(run);
      const n = 40;
      for (let i = 0; i < n; i++) {
        const skus = [...new Set(Array.from({ length: 1 + Math.floor(random() * 3) }, () => skuOn(Math.floor(random() * VSHARDS), i)))];
        deliver(`s${seed}-m${i}`, skus);
      }
      /** The tags 1..k of the longest finished run at the head: what must be acked once the pipeline has had its turn. */
      const finishedHead = () => {
        let k = 0;
        while (k < n && acks.finished(k + 1, 1)) k++;
        return k;
      };
      while (acks.acked.size < n) {
        await waitFor(() => open.length > 0 || acks.acked.size === n, `seed ${seed}: a batch to answer`);
        if (open.length === 0) break;
        const run = open.splice(Math.floor(random() * open.length), 1)[0]!;
        run.resolve(result(run.task, () => PART_NEW));
        if (random() < 0.5) await nextTurn();
        // Acks are not held back: the finished run at the head is acked without waiting for more to finish.
        else await waitFor(() => acks.acked.size >= finishedHead(), `seed ${seed}: the finished head acked`);
      }
      expect(acks.violations, `seed ${seed}`).to.deep.equal([]);
      // The clock never moved, so nothing stalled: only multiple-acks, each covering a run of one or more tags.
      expect(
        acks.acks.filter((ack) => !ack.multiple),
        `seed ${seed}: single acks without a stall`,
      ).to.deep.equal([]);
    }
  });

  it('reruns a batch whose reply was lost with the same batch id, so its receipt stops a second count (invariant 12)', async () => {
    const { thread, acks, deliver, count } = setUp();
    // The thread's Redis: counts per SKU, and the receipts of the batches that wrote.
    const counts = new Map<string, number>();
    const receipts = new Set<string>();
    let runs = 0;
    thread.respond = (run) => {
      if (!receipts.has(run.task.batchId)) {
        receipts.add(run.task.batchId);
        for (const part of run.task.changes) for (const [sku, delta] of part) counts.set(sku, (counts.get(sku) ?? 0) + delta);
      }
      // The first attempt's counts are written, then its reply is lost (the thread died).
      if (runs++ === 0) run.reject(new Error('worker exited'));
      else run.resolve(result(run.task, () => PART_NEW));
    };
    const sku = skuOn(2);
    deliver('once', [sku]);
    await waitFor(() => acks.acked.size === 1, 'the ack after the rerun');
    expect(thread.runs.length).to.equal(2);
    expect(thread.runs[1]!.task.batchId).to.equal(thread.runs[0]!.task.batchId);
    expect(counts.get(sku), 'counted once over both runs').to.equal(1);
    expect(count('counted')).to.equal(1);
  });

  it('isolates a batch refused for its data: the failing part is dead-lettered, the others counted, each half under its own id', async () => {
    const { thread, deadLetters, acks, deliver, count } = setUp({ batchWaitMs: 20 });
    thread.respond = (run) => {
      if (run.task.ids.includes('poison')) run.reject(new ClassifiedFailure('data', 'TALLY_SCRIPT_ARGS bad'));
      else run.resolve(result(run.task, () => PART_NEW));
    };
    deliver('ok1', [skuOn(3)]);
    deliver('poison', [skuOn(3, 1)]);
    deliver('ok2', [skuOn(3, 2)]);
    await waitFor(() => acks.acked.size === 3, 'all three settled');
    expect(deadLetters.published.map((letter) => letter.tag)).to.deep.equal([2]);
    expect(count('counted')).to.equal(2);
    const ids = thread.runs.map((run) => run.task.batchId);
    expect(new Set(ids.map((id) => id.split('.')[0])).size, 'one batch, split').to.equal(1);
  });

  it('never acks on a new channel what came on the old one', async () => {
    const { pipeline, thread, acks, link, accept, deliver } = setUp();
    const held: Run[] = [];
    thread.respond = (run) => held.push(run);
    deliver('old', [skuOn(0)]);
    await waitFor(() => held.length === 1, 'the batch');
    link.alive = false;
    expect(pipeline.channelDown(link)).to.equal(1);
    const next = channel(2);
    pipeline.channelUp(next);
    held[0]!.resolve(result(held[0]!.task, () => PART_NEW));
    await sleep(10);
    expect(acks.acks).to.deep.equal([]);
    // A late delivery of the dead channel is ignored: it will be redelivered.
    deliver('late', [skuOn(1)], link);
    thread.respond = (run) => run.resolve(result(run.task, () => PART_NEW));
    accept(next, message(1, 'new', [skuOn(1)]));
    await waitFor(() => acks.acks.length === 1, 'the new channel ack');
    expect(acks.acks).to.deep.equal([{ tag: 1, multiple: true, generation: 2 }]);
    expect(thread.ids).to.not.include('late');
  });

  it("with message-scoped markers, sends a message's changes as one part to its digest's marker shard", async () => {
    const { thread, acks, deliver, count } = setUp({ recordedMarkerScope: 'message' });
    deliver('whole', [skuOn(0), skuOn(1), skuOn(2)]);
    await waitFor(() => acks.acked.size === 1, 'the ack');
    expect(thread.runs.map((run) => [run.task.vshard, run.task.ids, run.task.changes[0]!.length])).to.deep.equal([
      [markerShardOf(markerDigest('whole'), VSHARDS), ['whole'], 3],
    ]);
    expect(count('counted')).to.equal(1);
  });

  it('hands a bug on the batch path to the bug handler at once, never retried, and acks nothing after it (invariant 13)', async () => {
    const bugs: Array<{ error: unknown; where: string }> = [];
    const { thread, acks, deliver } = setUp({}, (error, where) => void bugs.push({ error, where }));
    const held: Run[] = [];
    thread.respond = (run) => (run.task.vshard === 0 ? run.reject(new TypeError('x is undefined')) : held.push(run));
    deliver('broken', [skuOn(0)]);
    deliver('fine', [skuOn(1)]);
    await waitFor(() => bugs.length === 1 && held.length === 1, 'the bug and the other batch');
    expect(bugs[0]!.where).to.equal('batch');
    expect((bugs[0]!.error as Error).message).to.equal('x is undefined');
    expect(thread.runs.filter((run) => run.task.vshard === 0).length, 'not retried').to.equal(1);
    held[0]!.resolve(result(held[0]!.task, () => PART_NEW));
    await sleep(10);
    expect(acks.acks, 'nothing acked after a bug').to.deep.equal([]);
  });

  it('hands a bug on the delivery path to the bug handler (TALLY_FAULT_BUG=main: the ack tracker throws)', () => {
    const bugs: string[] = [];
    const { deliver } = setUp({ injectBug: 'main' }, (_error, where) => void bugs.push(where));
    deliver('any', [skuOn(0)]);
    expect(bugs).to.deep.equal(['delivery']);
  });

  it('drains: resolves once every batch and dead letter is settled', async () => {
    const { pipeline, thread, deliver } = setUp({ batchWaitMs: 60_000 });
    const held: Run[] = [];
    thread.respond = (run) => held.push(run);
    deliver('d1', [skuOn(0)]);
    expect(pipeline.drained).to.equal(false);
    pipeline.flushAll();
    const drained = pipeline.drainWithin(5_000);
    await waitFor(() => held.length === 1, 'the flushed batch');
    held[0]!.resolve(result(held[0]!.task, () => PART_NEW));
    expect(await drained).to.equal(true);
    expect(await setUp().pipeline.drainWithin(0)).to.equal(true);
    pipeline.close();
  });
});
