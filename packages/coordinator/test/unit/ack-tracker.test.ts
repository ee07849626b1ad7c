import { expect } from 'chai';
import { seededRandom } from '@tally/workload';
import { AckTracker } from '../../src/pipeline/ack-tracker.js';

function shuffled(n: number, random: () => number): number[] {
  const tags = Array.from({ length: n }, (_, i) => i + 1);
  for (let i = tags.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [tags[i], tags[j]] = [tags[j]!, tags[i]!];
  }
  return tags;
}

function receiveUpTo(tracker: AckTracker, n: number): void {
  for (let tag = 1; tag <= n; tag++) tracker.received(tag);
}

describe('AckTracker', function () {
  // The property tests run thousands of steps: well under a second alone, but the machine is shared.
  this.timeout(30_000);

  it('has nothing to ack when nothing was received', () => {
    const tracker = new AckTracker();
    expect(tracker.takeAckable()).to.equal(null);
    expect(tracker.unacked).to.equal(0);
    expect(tracker.inProgress).to.equal(0);
  });

  it('acks a delivery finished in order', () => {
    const tracker = new AckTracker();
    tracker.received(1);
    expect(tracker.takeAckable()).to.equal(null);
    tracker.finish(1);
    expect(tracker.takeAckable()).to.equal(1);
    expect(tracker.takeAckable()).to.equal(null);
  });

  it('gives only contiguous multiple-acks when completions come out of order', () => {
    const tracker = new AckTracker();
    receiveUpTo(tracker, 6);
    tracker.finish(3);
    tracker.finish(2);
    expect(tracker.takeAckable(), '1 still in progress').to.equal(null);
    tracker.finish(5);
    expect(tracker.takeAckable()).to.equal(null);
    tracker.finish(1);
    expect(tracker.takeAckable(), '1..3 finished, 4 not').to.equal(3);
    expect(tracker.takeAckable()).to.equal(null);
    tracker.finish(6);
    expect(tracker.takeAckable(), '4 still in progress').to.equal(null);
    tracker.finish(4);
    expect(tracker.takeAckable()).to.equal(6);
    expect(tracker.takeAckable()).to.equal(null);
  });

  it('reports unacked and inProgress along the way', () => {
    const tracker = new AckTracker();
    receiveUpTo(tracker, 5);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([5, 5]);
    tracker.finish(2);
    tracker.finish(4);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([5, 3]);
    expect(tracker.takeAckable()).to.equal(null);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([5, 3]);
    tracker.finish(1);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([5, 2]);
    expect(tracker.takeAckable()).to.equal(2);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([3, 2]);
    tracker.received(6);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([4, 3]);
    for (const tag of [3, 5, 6]) tracker.finish(tag);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([4, 0]);
    expect(tracker.takeAckable()).to.equal(6);
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([0, 0]);
  });

  it('throws when a delivery is finished twice, before or after its ack', () => {
    const tracker = new AckTracker();
    receiveUpTo(tracker, 3);
    tracker.finish(2);
    expect(() => tracker.finish(2)).to.throw(RangeError);
    tracker.finish(1);
    expect(tracker.takeAckable()).to.equal(2);
    expect(() => tracker.finish(1)).to.throw(RangeError);
    expect(() => tracker.finish(2)).to.throw(RangeError);
    // The failed calls changed nothing.
    expect([tracker.unacked, tracker.inProgress]).to.deep.equal([1, 1]);
    tracker.finish(3);
    expect(tracker.takeAckable()).to.equal(3);
  });

  it('throws when a delivery that was never received is finished', () => {
    const tracker = new AckTracker();
    expect(() => tracker.finish(1)).to.throw(RangeError);
    receiveUpTo(tracker, 2);
    expect(() => tracker.finish(3)).to.throw(RangeError);
    expect(() => tracker.finish(0)).to.throw(RangeError);
    expect(() => tracker.finish(-1)).to.throw(RangeError);
    expect(tracker.inProgress).to.equal(2);
  });

  it('throws when deliveries are received out of sequence', () => {
    const tracker = new AckTracker();
    expect(() => tracker.received(2), 'first tag must be 1').to.throw(RangeError, /out of sequence/);
    expect(() => tracker.received(0)).to.throw(RangeError);
    tracker.received(1);
    expect(() => tracker.received(1), 'repeated').to.throw(RangeError);
    expect(() => tracker.received(3), 'gap').to.throw(RangeError);
    tracker.received(2);
    expect(tracker.unacked).to.equal(2);
  });

  it('property: random permutations of 1..N with acks taken at random moments', () => {
    const random = seededRandom(0xacc);
    let acksTaken = 0;
    /** Tag t is received at time t, and ages are read at NOW: the oldest unacked age names the lowest unacked tag. */
    const NOW = 1_000_000;
    for (let run = 0; run < 300; run++) {
      // Mostly mid-sized, always including the edges 1 and 500.
      const n = run === 0 ? 1 : run === 1 ? 500 : 1 + Math.floor(random() * 500);
      const tracker = new AckTracker();
      const order = shuffled(n, random);
      const finished = new Set<number>();
      let received = 0;
      let lastAck = 0;
      const interleaveReceives = random() < 0.5;
      if (!interleaveReceives) {
        for (let tag = 1; tag <= n; tag++) tracker.received(tag, tag);
        received = n;
      }
      /** The tracker's own view of what is unacked: its counts and the age of the lowest unacked tag. */
      const expectUnacked = () => {
        expect(tracker.unacked).to.equal(received - lastAck);
        expect(tracker.inProgress).to.equal(received - finished.size);
        expect(tracker.oldestUnackedAgeMs(NOW), `run ${run}: the age of tag ${lastAck + 1}`).to.equal(received > lastAck ? NOW - (lastAck + 1) : null);
      };

      const take = () => {
        const tag = tracker.takeAckable();
        const expectedEnd = (() => {
          let t = lastAck;
          while (finished.has(t + 1)) t++;
          return t;
        })();
        if (tag === null) {
          expect(expectedEnd, `seed run ${run}: nothing ackable although ${lastAck + 1} is finished`).to.equal(lastAck);
          return;
        }
        acksTaken++;
        // Never acked twice: every ack moves strictly forward.
        expect(tag, `run ${run}`).to.be.greaterThan(lastAck);
        // Every tag it covers is finished...
        for (let t = lastAck + 1; t <= tag; t++) {
          if (!finished.has(t)) expect.fail(`run ${run}: ack ${tag} covers unfinished tag ${t}`);
        }
        // ...and it covers the whole contiguous run, no less.
        expect(tag, `run ${run}`).to.equal(expectedEnd);
        lastAck = tag;
      };

      for (const tag of order) {
        // Deliveries arrive in tag order; a tag can only finish once received.
        while (received < tag) {
          ++received;
          tracker.received(received, received);
          if (random() < 0.1) take();
        }
        tracker.finish(tag);
        finished.add(tag);
        expectUnacked();
        if (random() < 0.3) take();
        expectUnacked();
      }
      take();
      expect(lastAck, `run ${run}: everything acked at the end`).to.equal(n);
      expect(tracker.takeAckable()).to.equal(null);
      expect(tracker.unacked).to.equal(0);
      expect(tracker.inProgress).to.equal(0);
      expect(tracker.oldestUnackedAgeMs(NOW)).to.equal(null);
      expect(() => tracker.finish(1 + Math.floor(random() * n))).to.throw(RangeError);
    }
    // Acks were taken along the way, not only once at the end of each run: the checks above saw the tracker mid-stream.
    expect(acksTaken).to.be.greaterThan(300);
  });

  it('acks every 500th tag over a million deliveries finished in order', () => {
    const tracker = new AckTracker();
    for (let tag = 1; tag <= 1_000_000; tag++) {
      tracker.received(tag);
      tracker.finish(tag);
      if (tag % 500 === 0) expect(tracker.takeAckable()).to.equal(tag);
    }
    expect(tracker.unacked).to.equal(0);
  });

  it('property: a long stream through a 2,000-tag window, finished out of order with stalls, keeps exact acks and ages', () => {
    // Tens of thousands of tags through a full prefetch window: what a
    // tracker that reuses its storage (a ring, a compacted array) must get right.
    const random = seededRandom(0x10c4);
    const tracker = new AckTracker();
    const window = 2_000;
    const total = 40_000;
    const outstanding = new Set<number>();
    const finished = new Set<number>();
    const receivedAt = new Map<number, number>();
    let now = 0;
    let received = 0;
    let inFlight: number[] = [];
    const check = () => {
      expect(tracker.unacked).to.equal(outstanding.size);
      const oldest = outstanding.size === 0 ? null : Math.min(...outstanding);
      expect(tracker.oldestUnackedAgeMs(now)).to.equal(oldest === null ? null : now - receivedAt.get(oldest)!);
    };
    while (received < total || inFlight.length > 0) {
      while (received < total && outstanding.size < window) {
        tracker.received(++received, now);
        receivedAt.set(received, now);
        outstanding.add(received);
        inFlight.push(received);
      }
      now += 1;
      // Finish a random tenth of what is in flight, the oldest one more rarely (a slow head).
      const keep: number[] = [];
      for (const tag of inFlight) {
        if (random() < (tag === inFlight[0] ? 0.02 : 0.1)) {
          tracker.finish(tag);
          finished.add(tag);
        } else keep.push(tag);
      }
      inFlight = keep;
      for (const tag of tracker.takeStalledAcks(20, now)) {
        expect(outstanding.has(tag) && finished.has(tag), `single ack of ${tag}`).to.equal(true);
        outstanding.delete(tag);
      }
      const upTo = tracker.takeAckable();
      if (upTo !== null) {
        expect(outstanding.has(upTo), `multiple ack names ${upTo}`).to.equal(true);
        for (const tag of [...outstanding]) {
          if (tag > upTo) continue;
          expect(finished.has(tag), `multiple ack ${upTo} covers unfinished ${tag}`).to.equal(true);
          outstanding.delete(tag);
        }
      }
      check();
    }
    expect(tracker.unacked).to.equal(0);
    expect(tracker.inProgress).to.equal(0);
  });

  it('reports the age of the oldest unacked delivery, finished or not, and null when all are acked', () => {
    const tracker = new AckTracker();
    expect(tracker.oldestUnackedAgeMs(1_000)).to.equal(null);
    tracker.received(1, 100);
    tracker.received(2, 200);
    tracker.received(3, 300);
    expect(tracker.oldestUnackedAgeMs(1_000)).to.equal(900);
    // Tag 2 finishing does not ack anything: tag 1 is still the oldest.
    tracker.finish(2);
    expect(tracker.takeAckable()).to.equal(null);
    expect(tracker.oldestUnackedAgeMs(1_000)).to.equal(900);
    // Tag 1 finishes: 1 and 2 are acked, tag 3 is now the oldest.
    tracker.finish(1);
    expect(tracker.takeAckable()).to.equal(2);
    expect(tracker.oldestUnackedAgeMs(1_000)).to.equal(700);
    // Finished but not yet acked still counts: the broker holds its credit.
    tracker.finish(3);
    expect(tracker.oldestUnackedAgeMs(1_000)).to.equal(700);
    expect(tracker.takeAckable()).to.equal(3);
    expect(tracker.oldestUnackedAgeMs(1_000)).to.equal(null);
  });

  describe('a stalled head (invariant 10)', () => {
    it('hands out nothing before the head has been unfinished for stallMs', () => {
      const tracker = new AckTracker();
      for (let tag = 1; tag <= 4; tag++) tracker.received(tag, 0);
      tracker.finish(2);
      tracker.finish(3);
      expect(tracker.takeStalledAcks(1_000, 999)).to.deep.equal([]);
      expect(tracker.unacked).to.equal(4);
    });

    it('single-acks every finished tag behind a stuck head, in order, once', () => {
      const tracker = new AckTracker();
      for (let tag = 1; tag <= 6; tag++) tracker.received(tag, 0);
      tracker.finish(5);
      tracker.finish(2);
      tracker.finish(3);
      expect(tracker.takeStalledAcks(1_000, 1_000)).to.deep.equal([2, 3, 5]);
      expect(tracker.takeStalledAcks(1_000, 2_000), 'nothing twice').to.deep.equal([]);
      expect([tracker.unacked, tracker.inProgress]).to.deep.equal([3, 3]);
      expect(tracker.takeAckable(), 'the head is still unfinished').to.equal(null);
      // Finishing a singly acked tag again is a bug.
      expect(() => tracker.finish(3)).to.throw(RangeError);
      tracker.finish(6);
      expect(tracker.takeStalledAcks(1_000, 2_000), 'newly finished behind the same stuck head').to.deep.equal([6]);
      expect(tracker.oldestUnackedAgeMs(2_000), 'the stuck head is still the oldest').to.equal(2_000);
    });

    it('ends the later multiple-ack on an outstanding tag, skipping the singly acked ones', () => {
      const tracker = new AckTracker();
      for (let tag = 1; tag <= 6; tag++) tracker.received(tag, 0);
      for (const tag of [2, 3, 5]) tracker.finish(tag);
      expect(tracker.takeStalledAcks(1_000, 1_000)).to.deep.equal([2, 3, 5]);
      tracker.finish(1);
      // 1 outstanding, 2 and 3 acked, 4 unfinished: the multiple-ack names 1.
      expect(tracker.takeAckable()).to.equal(1);
      tracker.finish(4);
      tracker.finish(6);
      // 4 outstanding, 5 acked, 6 outstanding: one multiple-ack on 6 covers 4 and 6.
      expect(tracker.takeAckable()).to.equal(6);
      expect([tracker.unacked, tracker.inProgress]).to.deep.equal([0, 0]);
      expect(tracker.oldestUnackedAgeMs(5_000)).to.equal(null);
    });

    it('returns null when the run past the head holds only singly acked tags after the head (never names an acked tag)', () => {
      const tracker = new AckTracker();
      for (let tag = 1; tag <= 3; tag++) tracker.received(tag, 0);
      tracker.finish(2);
      tracker.finish(3);
      expect(tracker.takeStalledAcks(10, 10)).to.deep.equal([2, 3]);
      tracker.finish(1);
      expect(tracker.takeAckable(), 'only 1 is outstanding').to.equal(1);
      expect(tracker.takeAckable()).to.equal(null);
      expect(tracker.unacked).to.equal(0);
    });

    it("single-acks behind a head held by another daemon's claim at once, without waiting for stallMs", () => {
      const tracker = new AckTracker();
      for (let tag = 1; tag <= 5; tag++) tracker.received(tag, 0);
      for (const tag of [2, 4]) tracker.finish(tag);
      expect(tracker.takeStalledAcks(30_000, 10), 'an unfinished head, not held: wait').to.deep.equal([]);
      tracker.heldByClaim(1);
      expect(tracker.takeStalledAcks(30_000, 10)).to.deep.equal([2, 4]);
      tracker.finish(3);
      expect(tracker.takeStalledAcks(30_000, 20), 'newly finished behind the held head').to.deep.equal([3]);
      expect(tracker.oldestUnackedAgeMs(20), 'the held head is still the oldest').to.equal(20);
      // The held head finishes: the multiple-ack names it, the held mark is gone with it.
      tracker.finish(1);
      expect(tracker.takeAckable()).to.equal(1);
      tracker.heldByClaim(5);
      tracker.received(6, 30);
      tracker.finish(6);
      expect(tracker.takeStalledAcks(30_000, 40), 'the new head 5 is held').to.deep.equal([6]);
      tracker.finish(5);
      expect(tracker.takeAckable()).to.equal(5);
      expect([tracker.unacked, tracker.inProgress]).to.deep.equal([0, 0]);
    });

    it('does not single-ack behind an unheld head when a delivery further back is held', () => {
      const tracker = new AckTracker();
      for (let tag = 1; tag <= 4; tag++) tracker.received(tag, 0);
      tracker.heldByClaim(2);
      tracker.finish(3);
      tracker.finish(4);
      expect(tracker.takeStalledAcks(30_000, 10)).to.deep.equal([]);
      tracker.finish(1);
      expect(tracker.takeAckable(), 'up to the held one').to.equal(1);
      expect(tracker.takeStalledAcks(30_000, 10), 'now the head is held').to.deep.equal([3, 4]);
    });

    it('refuses to hold a delivery that finished or was never received', () => {
      const tracker = new AckTracker();
      receiveUpTo(tracker, 2);
      tracker.finish(1);
      expect(() => tracker.heldByClaim(1)).to.throw(RangeError);
      expect(() => tracker.heldByClaim(3)).to.throw(RangeError);
    });

    it('property: random interleavings of receive, finish, stalled acks and multiple-acks never ack a tag twice or an unfinished one, and ack all in the end', () => {
      const random = seededRandom(0x57a11);
      for (let run = 0; run < 300; run++) {
        const n = 1 + Math.floor(random() * 300);
        const stallMs = 50;
        const tracker = new AckTracker();
        // The broker's view: outstanding tags; an ack must name an outstanding tag.
        const outstanding = new Set<number>();
        const finished = new Set<number>();
        const acked = new Set<number>();
        let now = 0;
        let received = 0;
        const order = shuffled(n, random);
        const ackOne = (tag: number): void => {
          if (!outstanding.has(tag)) expect.fail(`run ${run}: single ack of ${tag}, not outstanding`);
          if (!finished.has(tag)) expect.fail(`run ${run}: single ack of unfinished ${tag}`);
          outstanding.delete(tag);
          acked.add(tag);
        };
        const ackUpTo = (tag: number): void => {
          if (!outstanding.has(tag)) expect.fail(`run ${run}: multiple ack names ${tag}, not outstanding`);
          for (const t of [...outstanding]) {
            if (t > tag) continue;
            if (!finished.has(t)) expect.fail(`run ${run}: multiple ack ${tag} covers unfinished ${t}`);
            outstanding.delete(t);
            acked.add(t);
          }
        };
        const maybeAck = (): void => {
          if (random() < 0.3) {
            const tag = tracker.takeAckable();
            if (tag !== null) ackUpTo(tag);
          }
          if (random() < 0.3) for (const tag of tracker.takeStalledAcks(stallMs, now)) ackOne(tag);
          expect(tracker.unacked, `run ${run}`).to.equal(outstanding.size);
          expect(tracker.inProgress, `run ${run}`).to.equal(received - finished.size);
        };
        for (const tag of order) {
          while (received < tag) {
            tracker.received(++received, now);
            outstanding.add(received);
            // Some deliveries wait for another daemon's claim for a while.
            if (random() < 0.05) tracker.heldByClaim(received);
            maybeAck();
          }
          now += Math.floor(random() * 20);
          tracker.finish(tag);
          finished.add(tag);
          maybeAck();
        }
        const last = tracker.takeAckable();
        if (last !== null) ackUpTo(last);
        expect(outstanding.size, `run ${run}: everything acked at the end`).to.equal(0);
        expect(acked.size).to.equal(n);
        expect(tracker.unacked).to.equal(0);
      }
    });
  });
});
