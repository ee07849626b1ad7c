/**
 * A client behind Sentinel that outlives ioredis's end-for-good race, against
 * real processes (one primary, one replica, three Sentinels).
 *
 * The race: the primary dies, the client reconnects and asks a Sentinel for
 * the primary; while that question is in flight, the failover detector of
 * the connection that died hears `+switch-master` and disconnects the
 * connector. ioredis then rejects the connect and sets the client to `end`
 * for good: every command fails "Connection is closed." and nothing
 * reconnects (ioredis issue 1683). Under load a CI run hit it in the daemon's
 * worker threads, which retried for four minutes against a client that would
 * never come back.
 *
 * Here the window is held open on purpose: the Sentinel the client asks
 * first is SIGSTOPped before the primary is killed, so the client's question
 * hangs there while the other two Sentinels fail over and publish the
 * switch; then it is resumed and answers.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { Redis } from 'ioredis';
import { parseInfo } from '@tally/shared';
import { createRedisClient, nodeAddress, REVIVING, type RedisClient } from '@tally/runtime';
import { startSentinelGroup, type SentinelGroup } from '@tally/testkit';
import { waitFor } from './runtime-probes.js';

function sentinelClient(port: number): Redis {
  const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 0, retryStrategy: () => null, commandTimeout: 2_000 });
  client.on('error', () => {});
  return client;
}

async function processId(port: number): Promise<number> {
  const client = sentinelClient(port);
  try {
    return Number(parseInfo(await client.info('server')).get('process_id'));
  } finally {
    client.disconnect();
  }
}

describe('Redis Sentinel: a client that hears the switch while it asks for the primary (integration)', function () {
  this.timeout(120_000);

  let group: SentinelGroup | null = null;
  let client: RedisClient | null = null;
  const stopped: number[] = [];
  const listeners: Redis[] = [];

  afterEach(async () => {
    for (const pid of stopped.splice(0)) process.kill(pid, 'SIGCONT');
    for (const listener of listeners.splice(0)) listener.disconnect();
    client?.disconnect();
    client = null;
    await group?.stop();
    group = null;
  });

  it('reconnects to the promoted primary instead of ending with "Connection is closed." for good', async () => {
    group = await startSentinelGroup({ masterName: 'tally-switch-race' });
    // A long Sentinel timeout holds the window open until the test resumes the stopped Sentinel.
    client = createRedisClient(group.url, 'tally-race-test', { sentinelCommandTimeout: 60_000 });
    const errors: string[] = [];
    client.on('error', (error: Error) => errors.push(error.message));
    const ends: number[] = [];
    client.on('end', () => ends.push(Date.now()));
    const revivals: number[] = [];
    client.on(REVIVING, (delayMs: number) => revivals.push(delayMs));
    expect(await client.set('before', '1')).to.equal('OK');

    const [asked, ...others] = group.sentinelPorts;
    const oldPrimary = group.nodes[0]!;
    // The other Sentinels announce the switch; the test hears it the way the client's detector does.
    const switched = Promise.all(
      others.map(async (port) => {
        const listener = sentinelClient(port!);
        listeners.push(listener);
        await listener.subscribe('+switch-master');
        return new Promise<void>((resolve) => listener.once('message', () => resolve()));
      }),
    ).then(() => undefined);

    const askedPid = await processId(asked!);
    process.kill(askedPid, 'SIGSTOP');
    stopped.push(askedPid);
    process.kill(oldPrimary.pid, 'SIGKILL');
    await Promise.race([switched, sleep(30_000).then(() => Promise.reject(new Error('no Sentinel announced +switch-master within 30 s')))]);
    // The client's own detector has heard it too by now; its question to the stopped Sentinel still hangs.
    await sleep(500);
    process.kill(askedPid, 'SIGCONT');
    stopped.splice(stopped.indexOf(askedPid), 1);

    const redis = client;
    await waitFor('the client answers from the promoted primary', async () => (await redis.set('after', '1').catch(() => null)) === 'OK', 30_000).catch(
      (error: unknown) =>
        Promise.reject(new Error(`${(error as Error).message}; status ${redis.status}, ends ${ends.length}, last errors: ${errors.slice(-3).join(' | ')}`)),
    );
    expect(nodeAddress(redis as Redis), 'connected to the promoted primary').to.not.equal(`127.0.0.1:${oldPrimary.port}`);
    expect(redis.status).to.equal('ready');
    expect(revivals, 'the race was hit: the client ended without being asked to, and came back').to.have.length.greaterThan(0);

    // The owner's own ends stay ends: quit, and a disconnect.
    const revived = revivals.length;
    expect(await redis.quit()).to.equal('OK');
    await sleep(1_000);
    expect([redis.status, revivals.length], 'after quit').to.deep.equal(['end', revived]);
    await redis.connect();
    redis.disconnect();
    await sleep(1_000);
    expect([redis.status, revivals.length], 'after disconnect').to.deep.equal(['end', revived]);
  });
});
