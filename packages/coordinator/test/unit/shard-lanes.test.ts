import { expect } from 'chai';
import type { Delivery } from '../../src/pipeline/delivery.js';
import { ShardLanes, type LaneOptions, type PendingPart } from '../../src/pipeline/shard-lanes.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
/** Lets promise callbacks (the lane's `.finally`) run. */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));
/** Polls until `condition` holds; fails after `timeoutMs`. Keeps timing tests robust on a loaded machine. */
async function waitFor(condition: () => boolean, what: string, timeoutMs = 2_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!condition()) {
    if (performance.now() > deadline) expect.fail(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

let nextTag = 1;
/** A part whose delivery tag identifies it; nothing else of the delivery is used by the lanes. */
function part(label?: string, changes = 1): PendingPart {
  const tag = nextTag++;
  return {
    delivery: { tag, id: label ?? `m-${tag}` } as unknown as Delivery,
    changes: Array.from({ length: changes }, (_, c): [string, number] => [`sku-${tag}-${c}`, 1]),
  };
}

interface Call {
  readonly vshard: number;
  readonly parts: PendingPart[];
  readonly at: number;
  done: boolean;
  resolve(): void;
}

/** A dispatch stub whose batches finish only when the test says so. */
class FakeDispatch {
  readonly calls: Call[] = [];
  readonly violations: string[] = [];
  private readonly inFlight = new Map<number, number>();

  readonly fn = (vshard: number, parts: PendingPart[]): Promise<void> => {
    const busy = this.inFlight.get(vshard) ?? 0;
    if (busy > 0) this.violations.push(`lane ${vshard} dispatched while a batch was in flight`);
    this.inFlight.set(vshard, busy + 1);
    return new Promise<void>((resolve) => {
      const call: Call = {
        vshard,
        parts: [...parts],
        at: performance.now(),
        done: false,
        resolve: () => {
          if (call.done) return;
          call.done = true;
          this.inFlight.set(vshard, (this.inFlight.get(vshard) ?? 1) - 1);
          resolve();
        },
      };
      this.calls.push(call);
    });
  };

  of(vshard: number): Call[] {
    return this.calls.filter((c) => c.vshard === vshard);
  }

  open(): Call[] {
    return this.calls.filter((c) => !c.done);
  }

  tags(call: Call): number[] {
    return call.parts.map((p) => p.delivery.tag);
  }
}

/** Lanes under test, closed after each test so no timer outlives it. */
let open: ShardLanes[] = [];
function lanes(options: Partial<LaneOptions>, dispatch: FakeDispatch): ShardLanes {
  const l = new ShardLanes({ virtualShards: 4, batchSize: 3, batchMaxChanges: 1_000_000, batchWaitMs: 10_000, ...options }, dispatch.fn);
  open.push(l);
  return l;
}

describe('ShardLanes', () => {
  afterEach(() => {
    for (const l of open) l.close();
    open = [];
  });

  it('flushes a lane synchronously when it reaches batchSize', () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 3 }, d);
    const parts = [part(), part(), part()];
    l.add(1, parts[0]!);
    l.add(1, parts[1]!);
    expect(d.calls).to.have.length(0);
    expect(l.depths()).to.deep.equal([0, 2, 0, 0]);
    l.add(1, parts[2]!);
    expect(d.calls).to.have.length(1);
    expect(d.calls[0]!.vshard).to.equal(1);
    expect(d.calls[0]!.parts).to.deep.equal(parts);
    expect(l.depths()).to.deep.equal([0, 0, 0, 0]);
    expect(l.load).to.deep.equal({ pendingParts: 0, busyLanes: 1 });
  });

  it('never dispatches a batch over batchMaxChanges, unless it is one part; flushes at the limit; keeps every part in order', async () => {
    const d = new FakeDispatch();
    const max = 50;
    const l = lanes({ batchSize: 40, batchMaxChanges: max, batchWaitMs: 5 }, d);
    let seed = 7;
    const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const added: number[] = [];
    for (let i = 0; i < 400; i++) {
      // Mostly small parts, some big, a few over the limit by themselves (a hostile message aimed at one shard).
      const size = random() < 0.05 ? max + 1 + Math.floor(random() * 100) : random() < 0.3 ? 10 + Math.floor(random() * 30) : 1 + Math.floor(random() * 4);
      const p = part(undefined, size);
      added.push(p.delivery.tag);
      l.add(0, p);
      for (const call of d.open()) call.resolve();
      await settle();
    }
    l.flushAll();
    while (l.load.busyLanes > 0 || l.load.pendingParts > 0) {
      for (const call of d.open()) call.resolve();
      await settle();
    }
    for (const call of d.calls) {
      const changes = call.parts.reduce((sum, p) => sum + p.changes.length, 0);
      if (call.parts.length > 1) expect(changes, `batch of ${call.parts.length} parts`).to.be.at.most(max);
      expect(call.parts.length).to.be.at.most(40);
    }
    expect(
      d.calls.some((c) => c.parts.length === 1 && c.parts[0]!.changes.length > max),
      'an oversized part goes alone',
    ).to.equal(true);
    expect(
      d.calls.flatMap((c) => d.tags(c)),
      'every part once, in order',
    ).to.deep.equal(added);
    expect(d.violations).to.deep.equal([]);
  });

  it('flushes synchronously when the changes waiting reach batchMaxChanges', () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 100, batchMaxChanges: 10 }, d);
    l.add(3, part(undefined, 4));
    l.add(3, part(undefined, 4));
    expect(d.calls).to.have.length(0);
    l.add(3, part(undefined, 4));
    expect(d.calls, 'twelve changes waiting: one batch of the first two parts (8 changes)').to.have.length(1);
    expect(d.calls[0]!.parts.map((p) => p.changes.length)).to.deep.equal([4, 4]);
    expect(l.depths()[3]).to.equal(1);
  });

  it('counts batchSize per lane, not across lanes', () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 2 }, d);
    l.add(0, part());
    l.add(1, part());
    l.add(2, part());
    expect(d.calls).to.have.length(0);
    l.add(2, part());
    expect(d.calls.map((c) => c.vshard)).to.deep.equal([2]);
  });

  it('flushes after batchWaitMs when the batch is not full', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 100, batchWaitMs: 30 }, d);
    const start = performance.now();
    const a = part();
    const b = part();
    l.add(2, a);
    l.add(2, b);
    await settle();
    expect(d.calls, 'not at once').to.have.length(0);
    await waitFor(() => d.calls.length > 0, 'the timed flush');
    expect(d.calls).to.have.length(1);
    expect(d.calls[0]!.parts).to.deep.equal([a, b]);
    // Timers may fire a hair early; never much before batchWaitMs.
    expect(d.calls[0]!.at - start).to.be.at.least(28);
  });

  it('times the wait from the oldest part, not the newest', async () => {
    const d = new FakeDispatch();
    const waitMs = 100;
    const l = lanes({ batchSize: 100, batchWaitMs: waitMs }, d);
    const start = performance.now();
    l.add(0, part());
    await sleep(20);
    const secondAt = performance.now();
    l.add(0, part());
    await waitFor(() => d.calls.length > 0, 'the timed flush');
    expect(d.calls[0]!.parts, 'both parts in the batch').to.have.length(2);
    expect(d.calls[0]!.at - start).to.be.at.least(waitMs - 2);
    // Timed from the newest part it could not fire before secondAt + waitMs.
    expect(d.calls[0]!.at).to.be.below(secondAt + waitMs - 5);
  });

  it('times parts that waited behind a busy batch from the oldest arrival, not from when the lane freed up', async () => {
    const d = new FakeDispatch();
    const waitMs = 150;
    const l = lanes({ batchSize: 100, batchWaitMs: waitMs }, d);
    l.add(0, part());
    l.flushAll();
    const arrivedAt = performance.now();
    l.add(0, part()); // waits behind batch 1
    await sleep(50);
    l.add(0, part()); // a newer part must not restart the clock
    await sleep(20);
    d.calls[0]!.resolve();
    // Due at arrivedAt + 150; timed from the newer part it would be about +200,
    // timed from the moment the lane freed up about +220.
    await waitFor(() => d.calls.length === 2, 'the timed flush of the waiting parts');
    expect(d.calls[1]!.parts).to.have.length(2);
    expect(d.calls[1]!.at - arrivedAt).to.be.at.least(waitMs - 2);
    expect(d.calls[1]!.at - arrivedAt).to.be.below(waitMs + 30);
  });

  it('flushes on the next timer tick with batchWaitMs 0', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 100, batchWaitMs: 0 }, d);
    l.add(3, part());
    expect(d.calls).to.have.length(0);
    await sleep(5);
    expect(d.calls).to.have.length(1);
  });

  it('never has two batches of one lane in flight; the next flushes when the first completes', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 2, batchWaitMs: 30 }, d);
    const first = [part(), part()];
    for (const p of first) l.add(0, p);
    expect(d.of(0)).to.have.length(1);

    // Meanwhile: a full batch and then some, plus time for the wait to run out.
    const more = [part(), part(), part(), part(), part()];
    for (const p of more) l.add(0, p);
    l.flushAll();
    await sleep(60);
    expect(d.of(0), 'no second dispatch while the first is in flight').to.have.length(1);
    expect(l.load).to.deep.equal({ pendingParts: 5, busyLanes: 1 });

    // Another lane is not held up by lane 0.
    l.add(1, part());
    l.add(1, part());
    expect(d.of(1)).to.have.length(1);

    d.of(0)[0]!.resolve();
    await settle();
    expect(d.of(0), 'flushes once the first completes').to.have.length(2);
    expect(d.tags(d.of(0)[1]!)).to.deep.equal(more.slice(0, 2).map((p) => p.delivery.tag));

    d.of(0)[1]!.resolve();
    await settle();
    expect(d.of(0)).to.have.length(3);
    expect(d.tags(d.of(0)[2]!)).to.deep.equal(more.slice(2, 4).map((p) => p.delivery.tag));

    d.of(0)[2]!.resolve();
    await waitFor(() => d.of(0).length === 4, 'the last, partial batch (after batchWaitMs)');
    expect(d.tags(d.of(0)[3]!)).to.deep.equal([more[4]!.delivery.tag]);
    expect(d.violations).to.deep.equal([]);
  });

  it('does not let the wait timer start a second batch while one is in flight', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 100, batchWaitMs: 20 }, d);
    l.add(0, part());
    await sleep(40);
    expect(d.calls).to.have.length(1);
    l.add(0, part());
    await sleep(60); // the new part waited three times batchWaitMs
    expect(d.calls, 'held back while busy').to.have.length(1);
    d.calls[0]!.resolve();
    await settle();
    expect(d.calls, 'overdue part flushed as soon as the lane is free').to.have.length(2);
    expect(d.violations).to.deep.equal([]);
  });

  it('flushAll on a busy lane flushes as soon as the batch in flight completes', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 100, batchWaitMs: 10_000 }, d);
    l.add(1, part());
    l.flushAll();
    expect(d.calls).to.have.length(1);
    const waiting = [part(), part()];
    for (const p of waiting) l.add(1, p);
    l.flushAll();
    expect(d.calls, 'busy: nothing new yet').to.have.length(1);
    d.calls[0]!.resolve();
    await settle();
    expect(d.calls, 'long before batchWaitMs').to.have.length(2);
    expect(d.calls[1]!.parts).to.deep.equal(waiting);
  });

  it('flushAll dispatches every non-empty idle lane once and leaves empty lanes alone', () => {
    const d = new FakeDispatch();
    const l = lanes({ virtualShards: 8, batchSize: 100 }, d);
    l.add(5, part());
    l.add(2, part());
    l.add(5, part());
    l.flushAll();
    expect(d.calls.map((c) => [c.vshard, c.parts.length])).to.deep.equal([
      [2, 1],
      [5, 2],
    ]);
    l.flushAll();
    expect(d.calls).to.have.length(2);
  });

  it('never exceeds batchSize, dispatches every part once, keeps per-lane order, and drains', async () => {
    const random = (() => {
      let seed = 777;
      return () => {
        seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
        return seed / 2 ** 32;
      };
    })();
    const d = new FakeDispatch();
    const batchSize = 7;
    const l = lanes({ virtualShards: 4, batchSize, batchWaitMs: 3 }, d);
    const added: number[][] = [[], [], [], []];
    for (let step = 0; step < 600; step++) {
      const r = random();
      if (r < 0.6) {
        const vshard = Math.floor(random() * 4);
        const p = part();
        added[vshard]!.push(p.delivery.tag);
        l.add(vshard, p);
      } else if (r < 0.85) {
        const pending = d.open();
        if (pending.length > 0) pending[Math.floor(random() * pending.length)]!.resolve();
        await settle();
      } else if (r < 0.95) {
        l.flushAll();
      } else {
        await sleep(4);
      }
    }
    // Complete everything that is or becomes in flight.
    const idle = l.whenIdle();
    let drained = false;
    void idle.then(() => {
      drained = true;
    });
    for (let i = 0; i < 500 && !drained; i++) {
      for (const call of d.open()) call.resolve();
      await sleep(2);
    }
    expect(drained, 'whenIdle resolved').to.equal(true);
    expect(l.load).to.deep.equal({ pendingParts: 0, busyLanes: 0 });
    for (const call of d.calls) {
      expect(call.parts.length).to.be.within(1, batchSize);
    }
    for (let vshard = 0; vshard < 4; vshard++) {
      const dispatched = d.of(vshard).flatMap((c) => d.tags(c));
      expect(dispatched, `lane ${vshard}: every part once, in order`).to.deep.equal(added[vshard]);
    }
    expect(d.violations).to.deep.equal([]);
  });

  it('keeps parts in the order they were added, across batches', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 4, batchWaitMs: 5 }, d);
    const parts = Array.from({ length: 10 }, () => part());
    for (const p of parts) l.add(3, p);
    expect(d.calls).to.have.length(1);
    while (d.open().length > 0 || l.load.pendingParts > 0) {
      for (const call of d.open()) call.resolve();
      await sleep(10);
    }
    expect(d.calls.map((c) => c.parts.length)).to.deep.equal([4, 4, 2]);
    expect(d.calls.flatMap((c) => c.parts)).to.deep.equal(parts);
  });

  it('whenIdle resolves at once when drained, and only after the last batch completes otherwise', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 2, batchWaitMs: 10_000 }, d);
    let immediate = false;
    await l.whenIdle().then(() => {
      immediate = true;
    });
    expect(immediate).to.equal(true);

    l.add(0, part());
    l.add(0, part()); // dispatched
    l.add(0, part()); // waiting behind it
    l.add(1, part()); // waiting in another lane
    let idle = false;
    const waiters = [l.whenIdle(), l.whenIdle()];
    void Promise.all(waiters).then(() => {
      idle = true;
    });
    await settle();
    expect(idle).to.equal(false);

    l.flushAll(); // lane 1 dispatches; lane 0 is asked to flush after its batch
    expect(d.calls).to.have.length(2);
    d.calls[0]!.resolve();
    await settle();
    expect(d.calls, 'lane 0 flushed its waiting part').to.have.length(3);
    expect(idle, 'two batches still in flight').to.equal(false);
    d.calls[1]!.resolve();
    await settle();
    expect(idle, 'one batch still in flight').to.equal(false);
    d.calls[2]!.resolve();
    await settle();
    expect(idle).to.equal(true);
    expect(l.load).to.deep.equal({ pendingParts: 0, busyLanes: 0 });
  });

  it('reports load and per-lane depths', () => {
    const d = new FakeDispatch();
    const l = lanes({ virtualShards: 3, batchSize: 2 }, d);
    expect(l.load).to.deep.equal({ pendingParts: 0, busyLanes: 0 });
    expect(l.depths()).to.deep.equal([0, 0, 0]);
    l.add(0, part());
    l.add(2, part());
    l.add(2, part()); // lane 2 dispatches
    l.add(2, part());
    expect(l.load).to.deep.equal({ pendingParts: 2, busyLanes: 1 });
    expect(l.depths()).to.deep.equal([1, 0, 1]);
  });

  it('close() stops the wait timers: waiting parts are not dispatched afterwards', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 100, batchWaitMs: 20 }, d);
    l.add(0, part());
    l.close();
    await sleep(50);
    expect(d.calls).to.have.length(0);
    expect(l.load.pendingParts).to.equal(1);
  });

  it('after flushAll keeps flushing a busy lane until its whole backlog is out (regression)', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 2, batchWaitMs: 10_000 }, d);
    l.add(0, part());
    l.add(0, part());
    for (let i = 0; i < 5; i++) l.add(0, part());
    l.flushAll();
    for (let i = 0; i < 4; i++) {
      d.calls.find((c) => !c.done)?.resolve();
      await settle();
    }
    expect(d.calls.map((c) => c.parts.length)).to.deep.equal([2, 2, 2, 1]);
  });

  it('does not restart the wait clock of parts left behind by a flush (regression)', async () => {
    const d = new FakeDispatch();
    const l = lanes({ batchSize: 2, batchWaitMs: 30 }, d);
    for (let i = 0; i < 5; i++) l.add(0, part());
    await sleep(60);
    d.calls[0]!.resolve();
    await settle();
    d.calls[1]!.resolve();
    await settle();
    expect(d.calls).to.have.length(3);
  });
});
