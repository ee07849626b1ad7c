import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { ATOMIC_BATCH } from '../src/atomic-batch.js';
import { CONFIRM_MARKERS } from '../src/replica-wait.js';
import { OCCUPY_MARKERS, WRITE_COUNTS } from '../src/two-step-batch.js';

const REDIS_URL = process.env.TALLY_REDIS_URL ?? 'redis://127.0.0.1:6379';
const SCRIPTS = [WRITE_COUNTS, OCCUPY_MARKERS, ATOMIC_BATCH, CONFIRM_MARKERS];

describe('Lua scripts as files', () => {
  it('loads each script from src/lua/<name>.lua, byte for byte, with its SHA1 computed from that text', () => {
    for (const script of SCRIPTS) {
      const file = readFileSync(new URL(`../../src/lua/${script.name}.lua`, import.meta.url));
      expect(Buffer.from(script.source, 'utf8').equals(file), script.name).to.equal(true);
      expect(script.sha, script.name).to.equal(createHash('sha1').update(file).digest('hex'));
    }
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
