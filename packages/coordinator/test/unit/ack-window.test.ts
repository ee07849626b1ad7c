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

/** Acks as RabbitMQ checks them, per channel: a tag acked twice (or a multiple-ack naming an acked tag) is a violation. */
class ChannelAcks implements Acker {
  readonly sent: Array<{ partition: number | undefined; tag: number; multiple: boolean }> = [];
  readonly acked = new Map<ChannelLink, Set<number>>();
  readonly violations: string[] = [];
  ack(link: ChannelLink, upTo: number, multiple: boolean): void {
    this.sent.push({ partition: link.partition, tag: upTo, multiple });
    const done = this.acked.get(link) ?? new Set<number>();
    this.acked.set(link, done);
    if (done.has(upTo)) this.violations.push(`partition ${link.partition}: tag ${upTo} acked twice`);
    const covered = multiple ? Array.from({ length: upTo }, (_, i) => i + 1).filter((t) => !done.has(t)) : [upTo];
    for (const tag of covered) done.add(tag);
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

describe('AckWindow per partition', () => {
  it('keeps each partition channel’s tags apart: the same tag numbers on two channels are two deliveries', () => {
    const acks = new ChannelAcks();
    const window = new AckWindow({ acker: acks, exposure: NO_EXPOSURE, clock: clock(), log: silent }, 30_000);
    const [p0, p1] = [partitionChannel(0), partitionChannel(1)];
    window.channelUp(p0);
    window.channelUp(p1);
    for (const link of [p0, p1]) for (let tag = 1; tag <= 3; tag++) window.received(link, tag);
    window.finish(p1, 1);
    window.finish(p1, 2);
    window.finish(p0, 2);
    window.send();
    // p1's run 1..2 goes out; p0's head (1) is unfinished, so nothing of p0.
    expect(acks.sent).to.deep.equal([{ partition: 1, tag: 2, multiple: true }]);
    expect([window.unackedOn(p0), window.unackedOn(p1), window.unacked]).to.deep.equal([3, 1, 4]);
    expect(window.channels().map((c) => [c.partition, c.unacked])).to.deep.equal([
      [0, 3],
      [1, 1],
    ]);
  });

  it('a stuck partition holds back only itself: its stall single-acks its own tags, the others go on with multiple-acks', () => {
    const acks = new ChannelAcks();
    const time = clock();
    const window = new AckWindow({ acker: acks, exposure: NO_EXPOSURE, clock: time, log: silent }, 1_000);
    const stuck = partitionChannel(3);
    const flowing = partitionChannel(5);
    window.channelUp(stuck);
    window.channelUp(flowing);
    window.received(stuck, 1); // never finishes
    window.received(stuck, 2);
    window.finish(stuck, 2);
    let next = 1;
    for (let round = 0; round < 5; round++) {
      for (let i = 0; i < 10; i++) window.received(flowing, next + i);
      for (let i = 0; i < 10; i++) window.finish(flowing, next + i);
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
    window.finish(stuck, 1);
    window.send();
    expect(acks.sent.at(-1)).to.deep.equal({ partition: 3, tag: 1, multiple: true });
    expect(acks.violations).to.deep.equal([]);
  });

  it('random completion orders over several partitions: every tag acked exactly once on its own channel', () => {
    const acks = new ChannelAcks();
    const time = clock();
    const window = new AckWindow({ acker: acks, exposure: NO_EXPOSURE, clock: time, log: silent }, 200);
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
        window.received(link, tag);
        open.push({ link, tag });
      } else {
        const [done] = open.splice(Math.floor(random() * open.length), 1);
        window.finish(done!.link, done!.tag);
      }
      time.advance(random() * 20);
      if (random() < 0.2) window.send();
    }
    for (const { link, tag } of open.splice(0)) window.finish(link, tag);
    window.send();
    expect(acks.violations).to.deep.equal([]);
    for (const link of links) {
      expect(acks.acked.get(link)?.size ?? 0, `partition ${link.partition}`).to.equal(received.get(link));
      expect(window.unackedOn(link)).to.equal(0);
    }
  });

  it('forgets a closed partition channel: its late deliveries are refused (the broker redelivers them)', () => {
    const window = new AckWindow({ acker: new ChannelAcks(), exposure: NO_EXPOSURE, clock: clock(), log: silent }, 1_000);
    const p0 = partitionChannel(0);
    window.channelUp(p0);
    window.received(p0, 1);
    expect(window.channelDown(p0)).to.equal(1);
    expect(window.received(p0, 2)).to.equal(false);
    expect(window.channelDown(p0)).to.equal(null);
  });
});
