import { AssertionError, strict as assert } from 'node:assert';
import { expect } from 'chai';
import { CliUsageError, ConfigError, describeError, UnknownReplyError } from '../src/errors.js';
import { ClassifiedFailure, classifyError, classifyRedisReply, isProgrammingError, isRedisReplyError, type FailureClass } from '../src/failure-class.js';

/** Shaped as ioredis raises a server's error line: a ReplyError named so. */
function replyError(message: string): Error {
  const error = new Error(message);
  error.name = 'ReplyError';
  return error;
}

const REPLIES: Array<[reply: string, expected: FailureClass]> = [
  ["OOM command not allowed when used memory > 'maxmemory'.", 'transient'],
  ['LOADING Redis is loading the dataset in memory', 'transient'],
  ['BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.', 'transient'],
  ["READONLY You can't write against a read only replica.", 'transient'],
  ["MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", 'transient'],
  // A connection that reached a replica during a Sentinel failover: waited out, never fatal.
  ['ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 if a replica is configured to be writable', 'transient'],
  ['TRYAGAIN Multiple keys request during rehashing of slot', 'transient'],
  ['CLUSTERDOWN The cluster is down', 'transient'],
  ['MOVED 3999 127.0.0.1:6381', 'transient'],
  ['ASK 3999 127.0.0.1:6381', 'transient'],
  ['NOSCRIPT No matching script. Please use EVAL.', 'transient'],
  ['MISCONF Redis is configured to save RDB snapshots, but it is currently not able to persist on disk.', 'transient'],
  ['ERR value is not an integer or out of range', 'data'],
  ['ERR increment or decrement would overflow', 'data'],
  ['WRONGTYPE Operation against a key holding the wrong kind of value', 'data'],
  ['TALLY_SCRIPT_ARGS part 3 has a bad change: x 1', 'data'],
  ["NOPERM User tally has no permissions to run the 'evalsha' command", 'fatal'],
  ['NOAUTH Authentication required.', 'fatal'],
  ['WRONGPASS invalid username-password pair or user is disabled.', 'fatal'],
  ["ERR unknown command 'EVALSHA', with args beginning with: ", 'fatal'],
  ['ERR scripting is disabled in this build', 'fatal'],
  ['ERR something no list knows about', 'fatal'],
];

describe('classifyRedisReply', () => {
  for (const [reply, expected] of REPLIES) {
    it(`${reply.split(' ').slice(0, 3).join(' ')} -> ${expected}`, () => {
      expect(classifyRedisReply(reply)).to.equal(expected);
    });
  }

  it('matches the reply code at the start only, not a word inside the text', () => {
    expect(classifyRedisReply('ERR user said OOM in a key name')).to.equal('fatal');
    expect(classifyRedisReply('ERR MOVED elsewhere')).to.equal('fatal');
    expect(classifyRedisReply('OOMPH not a code')).to.equal('fatal');
  });
});

describe('classifyError', () => {
  it('classifies a Redis error reply by its text', () => {
    for (const [reply, expected] of REPLIES) expect(classifyError(replyError(reply)), reply).to.equal(expected);
  });

  it('treats transport failures and dead threads as transient, whatever their text says', () => {
    expect(classifyError(new Error('connect ECONNREFUSED 127.0.0.1:6379'))).to.equal('transient');
    expect(classifyError(new Error('Connection is closed.'))).to.equal('transient');
    expect(classifyError(new Error('Command timed out'))).to.equal('transient');
    expect(classifyError(new Error('WRONGTYPE but not a reply'))).to.equal('transient');
    expect(classifyError('a thrown string')).to.equal('transient');
  });

  it("classifies Tally's own programming errors as bug: the built-in error types, node:assert, an unknown reply shape", () => {
    const thrown = (run: () => unknown): unknown => {
      try {
        run();
      } catch (error) {
        return error;
      }
      throw new Error('did not throw');
    };
    const real = [
      thrown(() => (undefined as unknown as { parts: number }).parts),
      thrown(() => new Array(-1)),
      thrown(() => (0).toFixed(101)),
      thrown(() => JSON.parse('{')),
      thrown(() => assert.equal(1, 2)),
      thrown(() => assert.ok(false)),
      thrown(() => structuredClone(() => 0)),
    ];
    const classes = real.map((error) => [(error as Error).name, classifyError(error)]);
    expect(classes).to.deep.equal([
      ['TypeError', 'bug'],
      ['RangeError', 'bug'],
      ['RangeError', 'bug'],
      ['SyntaxError', 'bug'],
      ['AssertionError', 'bug'],
      ['AssertionError', 'bug'],
      // structuredClone's DataCloneError is a DOMException, not one of ours: an unknown Error stays transient.
      ['DataCloneError', 'transient'],
    ]);
    expect(classifyError(new ReferenceError('x is not defined'))).to.equal('bug');
    expect(classifyError(new AssertionError({ message: 'parts add up' }))).to.equal('bug');
    const unknownReply = new UnknownReplyError('write_counts.lua', ['written', 'extra', { a: 1 }]);
    expect(unknownReply.code).to.equal('TALLY_UNKNOWN_REPLY');
    expect(classifyError(unknownReply), 'a TallyError, but a bug rather than a refusal').to.equal('bug');
    expect(isProgrammingError(new Error('plain'))).to.equal(false);
  });

  it('keeps the class a thread gave a failure, and the stack of where it happened', () => {
    const original = new TypeError("Cannot read properties of undefined (reading 'parts')");
    const crossed = new ClassifiedFailure('bug', original.message, original.stack);
    expect(classifyError(crossed)).to.equal('bug');
    expect(crossed.stack).to.equal(original.stack);
    expect(classifyError(new ClassifiedFailure('transient', 'Connection is closed.'))).to.equal('transient');
    expect(new ClassifiedFailure('data', 'WRONGTYPE').stack).to.match(/^ClassifiedFailure: WRONGTYPE/);
  });

  it('does not take an error for a bug by its message: only its type, name or code', () => {
    expect(classifyError(new Error('TypeError: something'))).to.equal('transient');
    expect(classifyError(replyError('ERR user_script:1: Script attempted to access nonexistent global variable'))).to.equal('fatal');
    const named = new Error('x');
    named.name = 'AssertionError';
    expect(classifyError(named)).to.equal('bug');
  });

  it('treats a TallyError as fatal', () => {
    expect(classifyError(new ConfigError('TALLY_PREFIX', 'bad'))).to.equal('fatal');
    expect(classifyError(new CliUsageError('bad'))).to.equal('fatal');
  });

  it('tells a reply error by its name only', () => {
    expect(isRedisReplyError(replyError('ERR x'))).to.equal(true);
    expect(isRedisReplyError(new Error('ERR x'))).to.equal(false);
    expect(isRedisReplyError({ name: 'ReplyError', message: 'ERR x' })).to.equal(false);
  });
});

describe('describeError', () => {
  it('gives an Error its message and stringifies anything else', () => {
    expect(describeError(new Error('boom'))).to.equal('boom');
    expect(describeError('plain')).to.equal('plain');
    expect(describeError(42)).to.equal('42');
    expect(describeError(undefined)).to.equal('undefined');
  });
});
