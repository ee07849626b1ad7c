import { access } from 'node:fs/promises';
import { expect } from 'chai';
import { Cluster } from 'ioredis';
import { parseClusterNodes, startRedisCluster, type RedisCluster } from '../src/index.js';

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('startRedisCluster', () => {
  let cluster: RedisCluster | null = null;

  afterEach(async () => {
    await cluster?.stop();
    cluster = null;
  });

  it('starts 3 masters and 3 replicas that serve keys in every slot range, and stop() leaves no process behind', async () => {
    cluster = await startRedisCluster();
    const nodes = await cluster.nodes();
    expect(nodes).to.have.length(6);
    const masters = nodes.filter((n) => n.role === 'master');
    const replicas = nodes.filter((n) => n.role === 'replica');
    expect(masters).to.have.length(3);
    expect(replicas).to.have.length(3);
    expect(masters.every((m) => m.slots.length > 0)).to.equal(true);
    // every master has exactly one replica
    expect(replicas.map((r) => r.masterPort).sort()).to.deep.equal(masters.map((m) => m.port).sort());
    expect(nodes.every((n) => n.alive && running(n.pid))).to.equal(true);

    const client = new Cluster([...cluster.seeds], { enableOfflineQueue: true });
    client.on('error', () => {});
    const keys = Array.from({ length: 30 }, (_, i) => `{sku-${i}}:count`);
    try {
      for (const [i, key] of keys.entries()) await client.set(key, String(i));
      for (const [i, key] of keys.entries()) expect(await client.get(key)).to.equal(String(i));
      // The keys landed on more than one master: the client really followed the slot map.
      const perMaster = await Promise.all(client.nodes('master').map((node) => node.dbsize()));
      expect(perMaster.reduce((a, b) => a + b, 0)).to.equal(keys.length);
      expect(perMaster.filter((n) => n > 0).length).to.be.greaterThan(1);
    } finally {
      client.disconnect();
    }

    const pids = nodes.map((n) => n.pid);
    const stopped = cluster;
    cluster = null;
    await access(stopped.dir);
    await stopped.stop();
    expect(pids.filter(running)).to.deep.equal([]);
    const gone = await access(stopped.dir).then(
      () => false,
      () => true,
    );
    expect(gone, `${stopped.dir} removed`).to.equal(true);
  });

  it('fails a SIGKILLed master over to its replica, which keeps the replicated keys', async () => {
    cluster = await startRedisCluster();
    const client = new Cluster([...cluster.seeds]);
    client.on('error', () => {});
    try {
      const keys = Array.from({ length: 30 }, (_, i) => `{k${i}}`);
      for (const key of keys) await client.set(key, 'v');
      // Replication is asynchronous: WAIT until each master's replica has the writes before the kill.
      await Promise.all(client.nodes('master').map((node) => node.call('WAIT', '1', '5000')));
      const { killed, promoted } = await cluster.failover();
      expect(running(killed.pid)).to.equal(false);
      expect(promoted.role).to.equal('master');
      expect(promoted.port).to.not.equal(killed.port);
      expect(promoted.slots).to.deep.equal(killed.slots);
      expect(await cluster.masters()).to.have.length(3);
      for (const key of keys) expect(await client.get(key)).to.equal('v');

      await cluster.restartNode(killed.port);
      await cluster.waitForHealthy();
      const rejoined = (await cluster.nodes()).find((n) => n.port === killed.port)!;
      expect(rejoined).to.include({ alive: true, role: 'replica', masterPort: promoted.port });
    } finally {
      client.disconnect();
    }
  });
});

describe('parseClusterNodes', () => {
  it('reads ids, ports, roles, masters, failure flags and slots', () => {
    const text = [
      'a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460',
      'b2 127.0.0.1:7001@17001,host master,fail - 1 1 2 disconnected',
      'c3 127.0.0.1:7002@17002 slave a1 0 5 1 connected',
      'd4 127.0.0.1:7003@17003 master - 0 5 3 connected 5461-10922 [5462->-e5]',
      '',
    ].join('\n');
    const nodes = parseClusterNodes(text);
    expect(nodes.map((n) => [n.id, n.port, n.role, n.masterId, n.failed, n.myself, n.connected])).to.deep.equal([
      ['a1', 7000, 'master', null, false, true, true],
      ['b2', 7001, 'master', null, true, false, false],
      ['c3', 7002, 'replica', 'a1', false, false, true],
      ['d4', 7003, 'master', null, false, false, true],
    ]);
    expect(nodes[0]!.slots).to.deep.equal(['0-5460']);
    expect(nodes[3]!.slots).to.deep.equal(['5461-10922']);
  });
});
