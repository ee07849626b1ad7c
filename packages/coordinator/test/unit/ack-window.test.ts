import { expect } from 'chai';
import type { Channel } from 'amqplib';
import pino from 'pino';
import type { ChannelLink } from '../../src/pipeline/delivery.js';
import { AckWindow } from '../../src/pipeline/ack-window.js';
import type { Acker, Clock, Exposure } from '../../src/pipeline/ports.js';

const silent = pino({ level: 'silent' });

/** One partition's channel: its tags start at 1, like a real channel's. */
function partitionChannel(partition: number): ChannelLink {
  return { generation: 1, channel: {} as Channel, alive: true, partition };
}

/**
 * Acks as RabbitMQ checks them, per channel, against what the test finished:
 * an ack naming a tag never delivered or already acked (a tag acked twice)
 * is a violation, and so is an ack of a tag the test has not finished, alone
 * or covered by a multiple-ack. The test records its deliveries and
 * completions here (deliver, finish), then hands them to the window.
 */
class ChannelAcks implements Acker {
  readonly sent: Array<{ partition: number | undefined; tag: number; multiple: boolean }> = [];
  readonly acked = new Map<ChannelLink, Set<number>>();
  readonly violations: string[] = [];
  private readonly delivered = new Map<ChannelLink, number>();
  private readonly finished = new Map<ChannelLink, Set<number>>();

  /** The window under test, which sends its acks here. */
  window!: AckWindow;

  deliver(link: ChannelLink, tag: number): boolean {
    this.delivered.set(link, Math.max(this.delivered.get(link) ?? 0, tag));
    return this.window.received(link, tag);
  }

  finish(link: ChannelLink, tag: number): void {
    const finished = this.finished.get(link) ?? new Set<number>();
    this.finished.set(link, finished);
    finished.add(tag);
    this.window.finish(link, tag);
  }

  ack(link: ChannelLink, upTo: number, multiple: boolean): void {
    this.sent.push({ partition: link.partition, tag: upTo, multiple });
    const done = this.acked.get(link) ?? new Set<number>();
    this.acked.set(link, done);
    const where = `partition ${link.partition}`;
    if (upTo > (this.delivered.get(link) ?? 0)) this.violations.push(`${where}: tag ${upTo} acked, never delivered`);
    if (done.has(upTo)) this.violations.push(`${where}: tag ${upTo} acked twice`);
    const covered = multiple ? Array.from({ length: upTo }, (_, i) => i + 1).filter((t) => !done.has(t)) : [upTo];
    for (const tag of covered) {
      if (!(this.finished.get(link)?.has(tag) ?? false)) this.violations.push(`${where}: tag ${tag} acked before it finished`);
      done.add(tag);
    }
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

function clock(): Clock & { advance(ms: number): void } {
  let ms = 1_000;
  return { now: () => ms, epochMs: () => 1_700_000_000_000 + ms, advance: (by) => void (ms += by) };
}

/** An ack window whose acks go to a checking fake, with `stallMs` and a clock the test moves. */
function setUp(stallMs: number, time = clock()): { window: AckWindow; acks: ChannelAcks; time: ReturnType<typeof clock> } {
  const acks = new ChannelAcks();
  const window = new AckWindow({ acker: acks, exposure: NO_EXPOSURE, clock: time, log: silent }, stallMs);
  acks.window = window;
  return { window, acks, time };
}

describe('AckWindow per partition', () => {
  it('keeps each partition channel’s tags apart: the same tag numbers on two channels are two deliveries', () => {
    const { window, acks } = setUp(30_000);
    const [p0, p1] = [partitionChannel(0), partitionChannel(1)];
    window.channelUp(p0);
    window.channelUp(p1);
    for (const link of [p0, p1]) for (let tag = 1; tag <= 3; tag++) acks.deliver(link, tag);
    acks.finish(p1, 1);
    acks.finish(p1, 2);
    acks.finish(p0, 2);
    window.send();
    // p1's run 1..2 goes out; p0's head (1) is unfinished, so nothing of p0.
    expect(acks.sent).to.deep.equal([{ partition: 1, tag: 2, multiple: true }]);
    expect([window.unackedOn(p0), window.unackedOn(p1), window.unacked]).to.deep.equal([3, 1, 4]);
    expect(window.channels().map((c) => [c.partition, c.unacked])).to.deep.equal([
      [0, 3],
      [1, 1],
    ]);
    expect(acks.violations).to.deep.equal([]);
  });

  it('a stuck partition holds back only itself: its stall single-acks its own tags, the others go on with multiple-acks', () => {
    const { window, acks, time } = setUp(1_000);
    const stuck = partitionChannel(3);
    const flowing = partitionChannel(5);
    window.channelUp(stuck);
    window.channelUp(flowing);
    acks.deliver(stuck, 1); // never finishes
    acks.deliver(stuck, 2);
    acks.finish(stuck, 2);
    let next = 1;
    for (let round = 0; round < 5; round++) {
      for (let i = 0; i < 10; i++) acks.deliver(flowing, next + i);
      for (let i = 0; i < 10; i++) acks.finish(flowing, next + i);
      next += 10;
      time.advance(300);
      window.send();
    }
    const ofFlowing = acks.sent.filter((a) => a.partition === 5);
    expect(ofFlowing.map((a) => a.tag)).to.deep.equal([10, 20, 30, 40, 50]);
    expect(ofFlowing.every((a) => a.multiple)).to.equal(true);
    // Past the stall threshold the stuck partition acked its finished tag 2 alone, and never tag 1.
    expect(acks.sent.filter((a) => a.partition === 3)).to.deep.equal([{ partition: 3, tag: 2, multiple: false }]);
    expect(window.oldestUnackedAgeMs()).to.equal(1_500);
    expect(window.channels().find((c) => c.partition === 5)?.oldestUnackedAgeMs).to.equal(null);
    // Tag 1 finishes at last: the multiple-ack ends on it, not on the singly acked 2.
    acks.finish(stuck, 1);
    window.send();
    expect(acks.sent.at(-1)).to.deep.equal({ partition: 3, tag: 1, multiple: true });
    expect(acks.violations).to.deep.equal([]);
  });

  it('random completion orders over several partitions: every tag acked exactly once on its own channel', () => {
    const { window, acks, time } = setUp(200);
    const links = [0, 1, 2, 3].map(partitionChannel);
    for (const link of links) window.channelUp(link);
    let seed = 7;
    const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const open: Array<{ link: ChannelLink; tag: number }> = [];
    const received = new Map(links.map((l) => [l, 0]));
    for (let step = 0; step < 4_000; step++) {
      if (random() < 0.55 || open.length === 0) {
        const link = links[Math.floor(random() * links.length)]!;
        const tag = received.get(link)! + 1;
        received.set(link, tag);
        acks.deliver(link, tag);
        open.push({ link, tag });
      } else {
        const [done] = open.splice(Math.floor(random() * open.length), 1);
        acks.finish(done!.link, done!.tag);
      }
      time.advance(random() * 20);
      if (random() < 0.2) window.send();
    }
    for (const { link, tag } of open.splice(0)) acks.finish(link, tag);
    window.send();
    expect(acks.violations).to.deep.equal([]);
    for (const link of links) {
      expect(acks.acked.get(link)?.size ?? 0, `partition ${link.partition}`).to.equal(received.get(link));
      expect(window.unackedOn(link)).to.equal(0);
    }
  });

  it('forgets a closed partition channel: its late deliveries are refused (the broker redelivers them)', () => {
    const { window, acks } = setUp(1_000);
    const p0 = partitionChannel(0);
    window.channelUp(p0);
    acks.deliver(p0, 1);
    expect(window.channelDown(p0)).to.equal(1);
    expect(acks.deliver(p0, 2)).to.equal(false);
    expect(window.channelDown(p0)).to.equal(null);
  });
});
