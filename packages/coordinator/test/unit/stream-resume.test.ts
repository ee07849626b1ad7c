/**
 * Where a stream partition resumes (resume-plan.ts), what its cursor does
 * with each offset on the way (stream-cursor.ts), and the checkpoint record
 * they read (checkpoint-record.ts): pure, no broker.
 */
import { expect } from 'chai';
import { decodeCheckpoint, encodeCheckpoint, type CheckpointRecord } from '../../src/stream/checkpoint-record.js';
import { planResume } from '../../src/stream/resume-plan.js';
import { bodyHash, ResumeCursor, type CursorStart } from '../../src/stream/stream-cursor.js';

const BODY = Buffer.from('{"id":"m-120","changes":[]}');

function checkpoint(offset: number, extra: Partial<CheckpointRecord> = {}): CheckpointRecord {
  return { offset, body: bodyHash(BODY), at: 1_700_000_000_000, known: [offset, -1, 90], rewinds: 0, ...extra };
}

describe('resume plan (stream partitions)', () => {
  it('reads a new partition from the start of its stream', () => {
    const plan = planResume({ checkpoint: null, bounds: { first: 0, last: 999 }, windowMs: 600_000 });
    expect(plan).to.deep.include({ kind: 'read', startAt: { kind: 'first' }, countFrom: 0, confirm: null, lostOffsets: 0 });
  });

  it('resumes after the checkpoint, never from a lower watermark, confirming the checkpointed message on the way', () => {
    const plan = planResume({ checkpoint: checkpoint(120), bounds: { first: 0, last: 999 }, windowMs: 0 });
    expect(plan).to.deep.include({ kind: 'read', startAt: { kind: 'offset', offset: 120 }, countFrom: 121, mustSee: null, lostOffsets: 0 });
    expect(plan.kind === 'read' && plan.confirm).to.deep.equal({ offset: 120, body: bodyHash(BODY) });
  });

  it('with the id window on, starts reading at the checkpoint time minus the window, counting still after the checkpoint', () => {
    const plan = planResume({ checkpoint: checkpoint(120), bounds: { first: 0, last: 999 }, windowMs: 600_000 });
    expect(plan).to.deep.include({ kind: 'read', startAt: { kind: 'time', epochMs: 1_700_000_000_000 - 600_000 }, countFrom: 121, mustSee: 120 });
  });

  it('refuses a stream that ends before the checkpoint, or is empty: it was deleted and recreated', () => {
    const short = planResume({ checkpoint: checkpoint(120), bounds: { first: 0, last: 40 }, windowMs: 0 });
    expect(short.kind).to.equal('refuse');
    expect(short.kind === 'refuse' && short.reason)
      .to.include('recreated')
      .and.include('40')
      .and.include('120');
    expect(planResume({ checkpoint: checkpoint(120), bounds: null, windowMs: 0 }).kind).to.equal('refuse');
  });

  it('counts and reads on past a retention gap: offsets deleted before they were counted', () => {
    const plan = planResume({ checkpoint: checkpoint(120), bounds: { first: 500, last: 999 }, windowMs: 600_000 });
    expect(plan).to.deep.include({ kind: 'read', startAt: { kind: 'offset', offset: 500 }, countFrom: 500, lostOffsets: 379, confirm: null });
  });

  it('loses nothing when retention took only the checkpointed message itself', () => {
    const plan = planResume({ checkpoint: checkpoint(120), bounds: { first: 121, last: 999 }, windowMs: 0 });
    expect(plan).to.deep.include({ kind: 'read', startAt: { kind: 'offset', offset: 121 }, countFrom: 121, lostOffsets: 0, confirm: null });
  });

  it('a rewound checkpoint (no body) resumes after it without a message to confirm; one rewound before the start reads from the start', () => {
    const plan = planResume({ checkpoint: checkpoint(120, { body: '' }), bounds: { first: 0, last: 999 }, windowMs: 0 });
    expect(plan).to.deep.include({ kind: 'read', startAt: { kind: 'offset', offset: 121 }, countFrom: 121, confirm: null });
    expect(planResume({ checkpoint: checkpoint(-1, { body: '' }), bounds: { first: 0, last: 9 }, windowMs: 0 })).to.deep.include({
      startAt: { kind: 'first' },
      countFrom: 0,
    });
  });
});

describe('resume cursor', () => {
  function cursor(start: Partial<CursorStart> = {}) {
    const events: string[] = [];
    const c = new ResumeCursor({ partition: 3, countFrom: 121, confirm: { offset: 120, body: bodyHash(BODY) }, mustSee: null, ...start }, null, {
      onMismatch: (detail) => events.push(`mismatch ${detail}`),
      onOvershoot: (offset) => events.push(`overshoot ${offset}`),
      onGap: (after, next) => events.push(`gap ${after}..${next}`),
    });
    return { c, events };
  }

  it('reads into the window before the resume point, confirms the checkpoint, then counts', () => {
    const { c, events } = cursor();
    expect(c.classify(100, Buffer.from('x'))).to.equal('window');
    expect(c.classify(120, BODY)).to.equal('window');
    expect(c.classify(121, Buffer.from('y'))).to.equal('count');
    expect(c.trusted).to.equal(true);
    expect(events).to.deep.equal([]);
  });

  it('refuses when the checkpointed offset holds another message, and skips everything after', () => {
    const { c, events } = cursor();
    expect(c.classify(120, Buffer.from('another body'))).to.equal('skip');
    expect(c.classify(121, Buffer.from('y'))).to.equal('skip');
    expect(c.trusted).to.equal(false);
    expect(events).to.have.length(1);
    expect(events[0]).to.match(/^mismatch offset 120 holds another message/);
  });

  it('refuses when the checkpointed offset never comes and later ones do', () => {
    const { c, events } = cursor();
    expect(c.classify(119, Buffer.from('x'))).to.equal('window');
    expect(c.classify(125, Buffer.from('y'))).to.equal('skip');
    expect(events[0]).to.match(/^mismatch offset 120, checkpointed, was not delivered/);
  });

  it('reports offsets that jump past a segment boundary while reading: retention deleted them under the reader', () => {
    const { c, events } = cursor({ confirm: null, countFrom: 0 });
    for (const offset of [0, 1, 2, 4, 5]) expect(c.classify(offset, Buffer.from('x'))).to.equal('count');
    expect(events, 'one offset skipped: a segment boundary').to.deep.equal([]);
    expect(c.classify(40, Buffer.from('x'))).to.equal('count');
    expect(events).to.deep.equal(['gap 5..40']);
  });

  it('a start by time that began past the checkpoint asks to start again by offset, committing nothing', () => {
    const { c, events } = cursor({ mustSee: 120 });
    expect(c.classify(130, Buffer.from('y'))).to.equal('skip');
    expect(c.trusted).to.equal(false);
    expect(events).to.deep.equal(['overshoot 130']);
  });
});

describe('checkpoint record', () => {
  it('round-trips, offsets as decimal strings up to 2^53', () => {
    const record = checkpoint(2 ** 53 - 1, { known: [2 ** 53 - 2, -1], rewinds: 3 });
    const raw = encodeCheckpoint(record);
    expect(JSON.parse(raw).offset).to.equal(String(2 ** 53 - 1));
    expect(decodeCheckpoint(raw)).to.deep.equal(record);
  });

  it('reads anything else as no checkpoint, never as a wrong one', () => {
    for (const raw of [
      '',
      'x',
      '{}',
      '[]',
      '{"offset":"1.5","body":"","at":1,"known":[],"rewinds":0}',
      '{"offset":"1","body":3,"at":1,"known":[],"rewinds":0}',
      '{"offset":"1","body":"","at":1,"known":["a"],"rewinds":0}',
    ])
      expect(decodeCheckpoint(raw), raw).to.equal(null);
  });
});
