import { expect } from 'chai';
import { shortWhere, summarizeProfile, type CpuProfile } from '../src/profile-summary.js';

const frame = (functionName: string, url = '', lineNumber = 0) => ({ functionName, url, lineNumber, columnNumber: 0 });

describe('profile summary', () => {
  const profile: CpuProfile = {
    nodes: [
      { id: 1, callFrame: frame('(root)'), children: [2, 3, 4] },
      { id: 2, callFrame: frame('(idle)'), children: [] },
      { id: 3, callFrame: frame('parseMessage', 'file:///work/main/packages/shared/dist/src/message.js', 9), children: [5] },
      { id: 4, callFrame: frame('', 'file:///work/main/node_modules/.pnpm/amqplib@2.3.1/node_modules/amqplib/lib/frame.js', 41), children: [] },
      { id: 5, callFrame: frame('parse'), children: [] },
    ],
    startTime: 0,
    endTime: 10_000,
    // timeDeltas[i+1] is the time spent in samples[i].
    samples: [2, 3, 5, 4, 3, 2],
    timeDeltas: [0, 4000, 1000, 2000, 1000, 1000, 1000],
  };

  it('attributes sampled time to functions, leaves idle out of the busy share, and ranks by self time', () => {
    const s = summarizeProfile(profile);
    expect(s.idleMs).to.equal(5);
    expect(s.busyMs).to.equal(5);
    // Ties rank by name.
    expect(s.functions.map((f) => [f.name, f.selfMs])).to.deep.equal([
      ['parse', 2],
      ['parseMessage', 2],
      ['(anonymous)', 1],
    ]);
    expect(s.functions[1]!.percentOfBusy).to.be.closeTo(40, 1e-9);
    expect(s.functions[1]!.where).to.equal('packages/shared/dist/src/message.js:10');
  });

  it('groups by package and file', () => {
    const s = summarizeProfile(profile);
    expect(s.files.map((f) => f.name)).to.include.members(['packages/shared/dist/src/message.js', 'amqplib/lib/frame.js']);
    expect(shortWhere('node:internal/streams/readable')).to.equal('node:internal/streams/readable');
  });
});
