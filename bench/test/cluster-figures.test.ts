import { expect } from 'chai';
import { parseInfo } from '@tally/shared';
import { keyGroups } from '../src/key-groups.js';
import { parseBenchArgs, BenchUsageError } from '../src/options.js';
import { commandCalls, errorCounts, keyspaceStats, perNodeDelta, sumCpuSeconds, sumInfoField, sumPerName } from '../src/redis-info.js';
import {
  idleCpuPerSecond,
  renderBreakdownTable,
  renderClusterRatioTable,
  renderFiguresTable,
  renderIdleLine,
  summarizeFigures,
  type IdleCpu,
  type TopologyDrain,
} from '../src/redis-figures.js';
import type { DrainRecord } from '../src/results.js';

const info = (lines: string[]) => parseInfo(`# Section\r\n${lines.join('\r\n')}\r\n`);

describe('INFO summed over a cluster', () => {
  it('adds a numeric field over every master', () => {
    const masters = [info(['used_memory:1000']), info(['used_memory:250']), info(['used_memory:5'])];
    expect(sumInfoField(masters, 'used_memory')).to.equal(1255);
    expect(sumInfoField([], 'used_memory')).to.equal(0);
  });

  it('makes the sum NaN when a server lacks the field, never a silent undercount', () => {
    expect(sumInfoField([info(['used_memory:1000']), info(['used_memory_rss:9'])], 'used_memory')).to.be.NaN;
    expect(sumInfoField([info(['used_memory:'])], 'used_memory')).to.be.NaN;
    expect(sumInfoField([info(['used_memory:12abc'])], 'used_memory')).to.be.NaN;
  });

  it('sums used_cpu_sys and used_cpu_user over servers', () => {
    const cpu = [info(['used_cpu_sys:1.500000', 'used_cpu_user:2.250000']), info(['used_cpu_sys:0.25', 'used_cpu_user:0.0'])];
    expect(sumCpuSeconds(cpu)).to.be.closeTo(4, 1e-9);
  });

  it('adds command calls per command over servers', () => {
    const a = info(['cmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00', 'cmdstat_mget:calls=2,usec=4']);
    const b = info(['cmdstat_evalsha:calls=5,usec=50', 'cmdstat_info:calls=1,usec=9']);
    expect(Object.fromEntries(sumPerName([a, b].map(commandCalls)))).to.deep.equal({ evalsha: 15, mget: 2, info: 1 });
  });

  it('reads error replies by prefix (MOVED, ASK are redirects)', () => {
    const a = info(['errorstat_MOVED:count=3', 'errorstat_NOSCRIPT:count=1']);
    const b = info(['errorstat_MOVED:count=2', 'total_error_replies:6']);
    expect(Object.fromEntries(sumPerName([a, b].map(errorCounts)))).to.deep.equal({ MOVED: 5, NOSCRIPT: 1 });
  });

  it('reads keys and the keyspace hash tables from MEMORY STATS, every db', () => {
    const reply = [
      'peak.allocated',
      9_000_000,
      'db.0',
      ['overhead.hashtable.main', 1000, 'overhead.hashtable.expires', 500, 'overhead.hashtable.slot-to-keys', 160],
      'db.1',
      ['overhead.hashtable.main', 40, 'overhead.hashtable.expires', 0],
      'keys.count',
      11,
      'dataset.bytes',
      123,
    ];
    expect(keyspaceStats(reply)).to.deep.equal({ keys: 11, hashtableBytes: 1700, slotToKeysBytes: 160 });
    expect(keyspaceStats([]).keys).to.be.NaN;
  });

  it('takes per-node deltas, NaN when a node came or went', () => {
    expect(perNodeDelta([10, 20, 30], [15, 20, 45])).to.deep.equal([5, 0, 15]);
    const changed = perNodeDelta([10, 20], [15, 20, 45]);
    expect(changed).to.have.length(3);
    expect(changed.every(Number.isNaN)).to.equal(true);
  });
});

describe('key groups for MGET', () => {
  const items = [
    { key: 'a', vshard: 3 },
    { key: 'b', vshard: 1 },
    { key: 'c', vshard: 3 },
    { key: 'd', vshard: 1 },
    { key: 'e', vshard: 3 },
  ];

  it('keeps one slot per group on a cluster, chunked', () => {
    const groups = keyGroups(items, true, 2).map((g) => g.map((i) => i.key));
    expect(groups).to.deep.equal([['a', 'c'], ['e'], ['b', 'd']]);
    for (const g of keyGroups(items, true)) expect(new Set(g.map((i) => i.vshard)).size).to.equal(1);
  });

  it('chunks any keys in order on a standalone server', () => {
    expect(keyGroups(items, false, 2).map((g) => g.map((i) => i.key))).to.deep.equal([['a', 'b'], ['c', 'd'], ['e']]);
    expect(keyGroups([], false, 2)).to.deep.equal([]);
    expect(() => keyGroups(items, false, 0)).to.throw(RangeError);
  });
});

describe('--redis-figures', () => {
  it('is on in the full scale-out run, off in the quick one unless asked, refused outside --scale-out', () => {
    expect(parseBenchArgs(['--scale-out']).redisFigures).to.equal(true);
    expect(parseBenchArgs(['--scale-out', '--quick']).redisFigures).to.equal(false);
    expect(parseBenchArgs(['--scale-out', '--quick', '--redis-figures']).redisFigures).to.equal(true);
    expect(parseBenchArgs([]).redisFigures).to.equal(false);
    expect(() => parseBenchArgs(['--redis-figures'])).to.throw(BenchUsageError, '--scale-out');
    expect(parseBenchArgs(['--scale-out']).clusterReplicas).to.equal(1);
    expect(parseBenchArgs(['--scale-out', '--cluster-replicas', '0']).clusterReplicas).to.equal(0);
    expect(() => parseBenchArgs(['--scale-out', '--cluster-replicas', '3'])).to.throw(BenchUsageError, '--cluster-replicas');
    expect(() => parseBenchArgs(['--cluster-replicas', '0'])).to.throw(BenchUsageError, '--scale-out');
    const steady = parseBenchArgs(['--scale-out', '--quick', '--steady-state', '--steady-rate', '3000']);
    expect(steady, '--steady-state brings the figures it adds drains to').to.include({ redisFigures: true, steadyState: true, steadyRate: 3_000 });
    expect(() => parseBenchArgs(['--partitions', '--steady-state'])).to.throw(BenchUsageError, '--steady-state');
  });
});

describe('Redis figures per topology', () => {
  const drain = (over: Partial<DrainRecord>): DrainRecord => ({
    contender: 'tally-two-step',
    round: 0,
    messages: 1_000,
    seconds: 2,
    msgPerSec: 500,
    cpuSeconds: 0.05,
    peakRssBytes: 1,
    redisCommands: 7_000,
    redisMemoryBytes: 110_000,
    redisCpuSeconds: 0.04,
    correct: true,
    ...over,
  });
  const cluster = { perMasterMemoryBytes: [50_000, 40_000, 30_000], replicationBacklogBytes: 0, replicaMemoryBytes: 118_000, replicaCpuSeconds: 0.01 };
  const drains: TopologyDrain[] = [
    { topology: 'standalone', record: drain({ contender: 'ceiling', msgPerSec: 1_000, redisCommands: null, redisMemoryBytes: 0 }) },
    { topology: 'standalone', record: drain({}) },
    { topology: 'cluster', record: drain({ contender: 'ceiling', msgPerSec: 800, redisCommands: null, redisMemoryBytes: 0 }) },
    {
      topology: 'cluster',
      record: drain({
        msgPerSec: 400,
        redisMemoryBytes: 120_000,
        redisCpuSeconds: 0.06,
        cluster,
        redisDetail: {
          keys: 150,
          hashtableBytes: 9_000,
          slotToKeysBytes: 2_400,
          commandCalls: { evalsha: 30, mget: 40 },
          errors: { MOVED: 2, NOSCRIPT: 1 },
        },
      }),
    },
  ];
  const idle: IdleCpu[] = [
    { topology: 'standalone', seconds: 5, mastersCpuSeconds: 0.01, replicasCpuSeconds: null },
    { topology: 'cluster', seconds: 5, mastersCpuSeconds: 0.05, replicasCpuSeconds: 0.04 },
  ];

  it('gives per-message figures, the ratio to the ceiling of the same topology, and the cluster-only columns', () => {
    const rows = summarizeFigures(drains, idle, 1);
    const two = (topology: string) => rows.find((r) => r.topology === topology && r.contender === 'tally-two-step')!;
    expect(two('standalone')).to.include({ ratioToCeiling: 0.5, redisBytesPerMessage: 110, cpuUsPerMessage: 50 });
    expect(two('standalone').redisCpuUsPerMessage).to.be.closeTo(40, 1e-9);
    expect(two('standalone').perMasterBytesPerMessage).to.deep.equal([]);
    expect(two('standalone').replicaBytesPerMessage).to.be.NaN;
    const c = two('cluster');
    expect(c).to.include({ ratioToCeiling: 0.5, redisBytesPerMessage: 120, backlogBytesPerMessage: 0, replicaBytesPerMessage: 118 });
    expect(c.redisCpuUsPerMessage).to.be.closeTo(60, 1e-9);
    expect(c.perMasterBytesPerMessage).to.deep.equal([50, 40, 30]);
    expect(c.replicaCpuUsPerMessage).to.be.closeTo(10, 1e-9);
    // idle 10 ms/s over a 2 s drain of 1,000 messages: 20 µs per message the servers spend anyway
    expect(c.idleCpuUsPerMessage).to.be.closeTo(20, 1e-9);
    expect(rows.filter((r) => r.contender === 'tally-atomic').every((r) => r.rounds === 0 && !r.correct)).to.equal(true);
  });

  it('breaks the cluster row down: keys, hash tables, redirects', () => {
    const rows = summarizeFigures(drains, idle, 1);
    const c = rows.find((r) => r.topology === 'cluster' && r.contender === 'tally-two-step')!;
    expect(c).to.include({ keysPerMessage: 0.15, hashtableBytesPerMessage: 9, slotToKeysBytesPerMessage: 2.4, redirects: 2 });
    const table = renderBreakdownTable(rows);
    expect(table).to.include('| cluster | Tally two-step | 0.150 | 9.0 | 2.4 | 2 |');
    expect(table).not.to.include('ceiling');
    const s = rows.find((r) => r.topology === 'standalone' && r.contender === 'tally-two-step')!;
    expect(s.keysPerMessage).to.be.NaN;
    expect(s.redirects).to.equal(0);
  });

  it('renders one row per topology and contender, and the idle line', () => {
    const table = renderFiguresTable(summarizeFigures(drains, idle, 1));
    expect(table.split('\n')).to.have.length(2 + 6);
    expect(table).to.include('| cluster | Tally two-step | 400 | 0.50 | 50.0 | 60.0 | 20.0 | 120 | 50 / 40 / 30 | 0 | 118 | 10.0 |');
    expect(renderIdleLine(idle)).to.equal("Idle server CPU, no client connected but the bench's: standalone 2.0 ms/s; cluster 10.0 ms/s (replicas 8.0 ms/s).");
    expect(idleCpuPerSecond(idle, 'cluster')).to.be.closeTo(0.01, 1e-12);
  });

  it('keeps steady-state drains in rows of their own and gives cluster ÷ standalone per Tally row', () => {
    const steady: TopologyDrain[] = [
      ...drains,
      { topology: 'standalone', record: drain({ variant: 'steady', redisCpuSeconds: 0.02 }) },
      {
        topology: 'cluster',
        record: drain({
          variant: 'steady',
          redisCpuSeconds: 0.03,
          cluster: { ...cluster, perMasterMemoryBytes: [10_000, 20_000, 30_000], replicaCpuSeconds: 0.02 },
          redisDetail: { keys: 900, hashtableBytes: 1_000, slotToKeysBytes: 100, commandCalls: {}, errors: {} },
        }),
      },
    ];
    const rows = summarizeFigures(steady, idle, 1);
    const row = (topology: string, label: string) => rows.find((r) => r.topology === topology && r.label === label)!;
    expect(row('standalone', 'Tally two-step').redisCpuUsPerMessage, 'the fresh row keeps its own drain').to.be.closeTo(40, 1e-9);
    expect(row('standalone', 'Tally two-step, steady state').redisCpuUsPerMessage).to.be.closeTo(20, 1e-9);
    expect(row('cluster', 'Tally two-step, steady state').redisCpuUsPerMessage).to.be.closeTo(30, 1e-9);
    const steadyCluster = row('cluster', 'Tally two-step, steady state');
    expect(steadyCluster.perMasterBytesPerMessage, 'per master: the steady drain alone').to.deep.equal([10, 20, 30]);
    expect(steadyCluster.keysPerMessage).to.be.closeTo(0.9, 1e-9);
    expect(steadyCluster.replicaCpuUsPerMessage).to.be.closeTo(20, 1e-9);
    expect(row('cluster', 'Tally two-step').perMasterBytesPerMessage, 'and the fresh row its fresh drain').to.deep.equal([50, 40, 30]);
    const table = renderClusterRatioTable(rows);
    expect(table).to.include('| Tally two-step | 40.0 | 60.0 | 1.50 |');
    expect(table).to.include('| Tally two-step, steady state | 20.0 | 30.0 | 1.50 |');
    expect(table, 'no ceiling row').not.to.include('ceiling');
  });

  it('holds every row against the hand-written batched consumer of its own topology, steady against steady', () => {
    const withBatched: TopologyDrain[] = [
      ...drains,
      { topology: 'standalone', record: drain({ contender: 'batched', msgPerSec: 250, redisCpuSeconds: 0.08 }) },
      { topology: 'cluster', record: drain({ contender: 'batched', msgPerSec: 200, redisCpuSeconds: 0.12 }) },
      { topology: 'standalone', record: drain({ variant: 'steady', redisCpuSeconds: 0.02 }) },
      { topology: 'standalone', record: drain({ contender: 'batched', variant: 'steady', redisCpuSeconds: 0.05 }) },
      { topology: 'cluster', record: drain({ variant: 'steady', redisCpuSeconds: 0.03 }) },
      { topology: 'cluster', record: drain({ contender: 'batched', variant: 'steady', redisCpuSeconds: 0.1 }) },
    ];
    const rows = summarizeFigures(withBatched, idle, 1);
    const row = (topology: string, label: string) => rows.find((r) => r.topology === topology && r.label === label)!;
    expect(row('standalone', 'Tally two-step').ratioToBatched, 'throughput: 500 ÷ 250').to.be.closeTo(2, 1e-9);
    expect(row('cluster', 'Tally two-step').ratioToBatched, 'throughput: 400 ÷ 200').to.be.closeTo(2, 1e-9);
    expect(row('standalone', 'Tally two-step, steady state').redisCpuToBatched, '20 µs ÷ the steady reference 50').to.be.closeTo(0.4, 1e-9);
    expect(row('cluster', 'Tally two-step, steady state').redisCpuToBatched, '30 µs ÷ the steady reference 100').to.be.closeTo(0.3, 1e-9);
    const table = renderClusterRatioTable(rows);
    expect(table).to.include('| standalone × batched | cluster × batched |');
    expect(table).to.include('| Tally two-step, steady state | 20.0 | 30.0 | 1.50 | 0.40 | 0.30 |');
    expect(table, "the reference's own cluster ÷ standalone").to.include('| 50.0 | 100.0 | 2.00 | 1.00 | 1.00 |');
  });
});
