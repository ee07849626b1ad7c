import { expect } from 'chai';
import { parseProcStat, parseStatusBytes } from '../src/proc.js';
import { parseInfo } from '@tally/shared';
import { callsDelta, commandCalls, commandUsec, sumValues } from '../src/redis-info.js';
import { parseBenchArgs, BenchUsageError } from '../src/options.js';
import { roundOrder } from '../src/run-bench.js';
import { threadOfProfile } from '../src/profile-run.js';

describe('parsers', () => {
  it('reads utime and stime from /proc/<pid>/stat even when the name has spaces and parentheses', () => {
    const line = '4242 (node (main) x) S 1 4242 4242 0 -1 4194304 1000 0 0 0 150 37 0 0 20 0 11 0 12345 1000000 5000 18446744073709551615';
    expect(parseProcStat(line)).to.deep.equal({ utime: 150, stime: 37 });
    expect(parseStatusBytes('Name:\tnode\nVmHWM:\t  204800 kB\nVmRSS:\t 1000 kB\n', 'VmHWM')).to.equal(204800 * 1024);
  });

  it('reads command calls from INFO commandstats and takes deltas', () => {
    const before = commandCalls(parseInfo('# Commandstats\r\ncmdstat_get:calls=3,usec=10,usec_per_call=3.3\r\ncmdstat_set:calls=1,usec=1\r\n'));
    const after = commandCalls(parseInfo('# Commandstats\r\ncmdstat_get:calls=10,usec=10\r\ncmdstat_set:calls=1,usec=1\r\ncmdstat_mget:calls=2,usec=4\r\n'));
    const delta = callsDelta(before, after);
    expect([...delta]).to.deep.equal([
      ['get', 7],
      ['mget', 2],
    ]);
    expect(sumValues(delta)).to.equal(9);
    const usec = callsDelta(
      commandUsec(parseInfo('# Commandstats\r\ncmdstat_get:calls=3,usec=10\r\ncmdstat_evalsha:calls=1,usec=500\r\n')),
      commandUsec(parseInfo('# Commandstats\r\ncmdstat_get:calls=10,usec=25\r\ncmdstat_evalsha:calls=2,usec=1500\r\ncmdstat_info:calls=1\r\n')),
    );
    expect([...usec]).to.deep.equal([
      ['get', 15],
      ['evalsha', 1000],
    ]);
  });

  it('parses flags with quick defaults and names the flag on a bad value', () => {
    const quick = parseBenchArgs(['--quick']);
    expect(quick).to.include({ quick: true, rounds: 1, command: 'run' });
    expect(quick.sweeps).to.deep.equal([]);
    const full = parseBenchArgs(['--changes', '8-16', '--contenders', 'ceiling,tally-two-step', '--sweeps', 'none']);
    expect(full).to.include({ rounds: 3, minChanges: 8, maxChanges: 16 });
    expect(full.contenders).to.deep.equal(['ceiling', 'tally-two-step']);
    expect(() => parseBenchArgs(['--rounds', '0'])).to.throw(BenchUsageError, '--rounds');
    expect(() => parseBenchArgs(['--changes', '9-2'])).to.throw(BenchUsageError, '--changes');
    expect(() => parseBenchArgs(['--contenders', 'kafka'])).to.throw(BenchUsageError, '--contenders');
    expect(() => parseBenchArgs(['--nope'])).to.throw(BenchUsageError);
  });

  it('takes --tally-env settings and refuses a name the daemon would refuse, before any setup', () => {
    expect(parseBenchArgs(['--tally-env', 'TALLY_BATCH_SIZE=50']).tallyEnv).to.deep.equal({ TALLY_BATCH_SIZE: '50' });
    expect(() => parseBenchArgs(['--tally-env', 'TALLY_BATCH_SIZ=50'])).to.throw(
      BenchUsageError,
      '--tally-env: TALLY_BATCH_SIZ is not a Tally setting; did you mean TALLY_BATCH_SIZE?',
    );
    expect(() => parseBenchArgs(['--tally-env', 'BATCH_SIZE=50'])).to.throw(BenchUsageError, 'TALLY_NAME=value');
  });

  it('rotates the contender order by round', () => {
    expect(roundOrder(['a', 'b', 'c'], 0)).to.deep.equal(['a', 'b', 'c']);
    expect(roundOrder(['a', 'b', 'c'], 1)).to.deep.equal(['b', 'c', 'a']);
    expect(roundOrder(['a', 'b', 'c'], 3)).to.deep.equal(['a', 'b', 'c']);
  });

  it('names the thread of a cpuprofile file', () => {
    expect(threadOfProfile('CPU.20250101.101010.4242.0.001.cpuprofile')).to.equal('main thread (pid 4242)');
    expect(threadOfProfile('CPU.20250101.101010.4242.3.002.cpuprofile')).to.equal('worker thread 3 (pid 4242)');
  });
});
