import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { ATOMIC_BATCH } from '../src/atomic-batch.js';
import { CONFIRM_MARKERS } from '../src/replica-wait.js';
import { expandIncludes } from '../src/lua-scripts.js';
import { CLAIM_MARKERS, OCCUPY_MARKERS, WRITE_COUNTS } from '../src/two-step-batch.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const SCRIPTS = [CLAIM_MARKERS, WRITE_COUNTS, OCCUPY_MARKERS, ATOMIC_BATCH, CONFIRM_MARKERS];
const LUA_DIR = new URL('../../src/lua/', import.meta.url);
const readSource = (path: string): string => readFileSync(new URL(`${path}.lua`, LUA_DIR), 'utf8');

describe('Lua scripts as files', () => {
  it('loads each script from src/lua/<name>.lua with its includes pasted in, and its SHA1 computed from that text', () => {
    for (const script of SCRIPTS) {
      const file = readSource(script.name);
      const expected = expandIncludes(file, (name) => readSource(`include/${name}`));
      expect(script.source, script.name).to.equal(expected);
      expect(script.source, script.name).to.not.match(/^-- @include /m);
      expect(script.sha, script.name).to.equal(createHash('sha1').update(expected).digest('hex'));
      // Outside the include lines, the script is its file byte for byte.
      for (const line of file.split('\n')) if (!line.startsWith('-- @include ')) expect(script.source, script.name).to.include(line);
    }
  });

  it('uses every include file, each pasted in whole where its line was', () => {
    const includes = readdirSync(new URL('include/', LUA_DIR)).map((file) => file.replace(/\.lua$/, ''));
    expect(includes).to.have.members(['count_apply', 'marker_buckets']);
    for (const name of includes) {
      const users = SCRIPTS.filter((script) => readSource(script.name).includes(`-- @include ${name}\n`));
      expect(users.length, name).to.be.at.least(2);
      for (const script of users) expect(script.source, `${script.name} has ${name}`).to.include(readSource(`include/${name}`).trimEnd());
    }
  });

  it('expands one level of includes and refuses an include inside an include', () => {
    expect(expandIncludes('a\n-- @include x\nb', () => 'X1\nX2\n')).to.equal('a\nX1\nX2\nb');
    // Only a line that is exactly an include line is replaced.
    expect(expandIncludes('x -- @include y', () => 'never')).to.equal('x -- @include y');
    expect(() => expandIncludes('-- @include x', () => '-- @include y')).to.throw(/one level only/);
  });

  it('keeps #!lua as the first line and the KEYS/ARGV header right after it', () => {
    for (const script of SCRIPTS) {
      const [first, second] = script.source.split('\n');
      expect(first, script.name).to.equal('#!lua');
      expect(second, script.name).to.equal('--[[');
      expect(script.source, script.name).to.include('Input:').and.include('KEYS[1').and.include('ARGV[1]').and.include('Output:');
    }
  });

  it('gets the same SHA back from SCRIPT LOAD as the one EVALSHA sends', async () => {
    const redis = new Redis(REDIS_URL);
    try {
      for (const script of SCRIPTS) expect(await redis.script('LOAD', script.source), script.name).to.equal(script.sha);
    } finally {
      redis.disconnect();
    }
  });
});
