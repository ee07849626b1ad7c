import { expect } from 'chai';
import { ClassifiedFailure } from '@tally/shared';
import { bugLogFields, EX_SOFTWARE, exitOnBug } from '../../src/process/bug-exit.js';
import type { Logger } from '../../src/process/logger.js';

class Exited extends Error {
  constructor(readonly code: number) {
    super(`exit ${code}`);
  }
}

describe('bug exit (invariant 13)', () => {
  it('logs the first bug once at level fatal with its stack, and exits 70 every time', () => {
    const lines: Array<[Record<string, unknown>, string]> = [];
    const log = { fatal: (fields: Record<string, unknown>, message: string) => lines.push([fields, message]) } as unknown as Logger;
    const exits: number[] = [];
    const onBug = exitOnBug(log, (code) => {
      exits.push(code);
      throw new Exited(code);
    });
    const first = new RangeError('delivery tag 9 out of sequence: expected 8');
    expect(() => onBug(first, 'delivery')).to.throw(Exited);
    expect(() => onBug(new TypeError('second'), 'batch')).to.throw(Exited);
    expect(exits).to.deep.equal([EX_SOFTWARE, EX_SOFTWARE]);
    expect(EX_SOFTWARE).to.equal(70);
    expect(lines).to.have.length(1);
    expect(lines[0]![0]).to.include({ where: 'delivery', failureClass: 'bug', errorType: 'RangeError', stack: first.stack, exitCode: 70 });
  });

  it("gives a thread's failure the thread's stack", () => {
    const stack = "TypeError: Cannot read properties of undefined (reading 'parts')\n    at processBatch (file:///x/worker/dist/src/thread.js:70:5)";
    const fields = bugLogFields(new ClassifiedFailure('bug', "Cannot read properties of undefined (reading 'parts')", stack), 'batch');
    expect(fields).to.include({ stack, classified: 'bug' });
    expect(bugLogFields('a string', 'unhandled rejection')).to.include({ stack: 'a string', errorType: 'string' });
  });
});
