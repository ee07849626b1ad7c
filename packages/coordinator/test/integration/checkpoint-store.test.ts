/**
 * The checkpoint scripts against the real Redis (checkpoint-store.ts): a
 * commit never moves a checkpoint back, a rewind does and counts itself,
 * and a commit made under an older rewind count is refused.
 */
import { expect } from 'chai';
import { deleteKeys } from '@tally/testkit';
import { CheckpointStore } from '../../src/stream/checkpoint-store.js';
import type { CheckpointRecord } from '../../src/stream/checkpoint-record.js';
import { REDIS_URL, uniqueName, withRedis } from './harness.js';

function record(offset: number, rewinds = 0): CheckpointRecord {
  return { offset, body: `b${offset}`, at: 1_700_000_000_000 + offset, known: [offset, -1], rewinds };
}

describe('checkpoint store (integration: the real Redis)', () => {
  const prefix = `${uniqueName('checkpoints')}:`;
  after(() => deleteKeys(REDIS_URL, prefix));

  it('commits forward only; a rewind moves back, counts itself, and refuses commits made under the old count', async () => {
    await withRedis(async (redis) => {
      const store = new CheckpointStore(redis, prefix);
      expect(await store.read(0)).to.equal(null);
      expect((await store.commit(0, record(100))).outcome).to.equal('written');
      expect((await store.commit(0, record(200))).outcome).to.equal('written');
      const behind = await store.commit(0, record(150));
      expect(behind.outcome, 'a daemon behind another writes nothing').to.equal('behind');
      expect((await store.read(0))?.offset).to.equal(200);

      expect(await store.rewind(0, 120)).to.equal(1);
      const rewound = await store.read(0);
      expect(rewound).to.include({ offset: 120, body: '', rewinds: 1 });
      expect(rewound?.known, 'the watermarks vouched for stay').to.deep.equal([200, -1]);
      // A rewind never moves forward: to 300 from 120 keeps 120.
      expect(await store.rewind(0, 300)).to.equal(2);
      expect((await store.read(0))?.offset).to.equal(120);

      const stale = await store.commit(0, record(250, 0));
      expect(stale.outcome, 'a daemon that missed the rewind cannot commit past it').to.equal('rewound');
      expect(stale.outcome === 'rewound' && stale.found?.rewinds).to.equal(2);
      expect((await store.commit(0, record(250, 2))).outcome).to.equal('written');

      expect((await store.readAll()).get(0)?.offset).to.equal(250);
      expect(await store.reset(0)).to.equal(true);
      expect(await store.read(0)).to.equal(null);
      expect(await store.rewind(1, -1), 'a rewind of a partition never committed').to.equal(1);
      expect((await store.read(1))?.offset).to.equal(-1);
    });
  });
});
