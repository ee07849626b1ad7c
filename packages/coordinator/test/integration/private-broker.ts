/**
 * Helpers of the tests that run the daemon against RabbitMQ nodes of their
 * own (testkit rabbit-cluster.ts) instead of the machine's default node: the
 * queue as one node reports it, draining through the daemon, and the node a
 * daemon says it is on (`tally status --json`).
 */
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { startDaemon, stopDaemon } from './harness.js';
import { tallyCli } from './fleet-helpers.js';

/** amqplib socket options: `{ ca }` for a node whose certificate a test CA signed. */
export type SocketOptions = Readonly<Record<string, unknown>>;

/** Ready messages and consumers of a queue, asked of one node. */
export async function queueStateAt(url: string, queue: string, socket: SocketOptions = {}): Promise<{ messageCount: number; consumerCount: number }> {
  const connection = await amqp.connect(url, socket);
  connection.on('error', () => {});
  try {
    const channel = await connection.createChannel();
    channel.on('error', () => {});
    const reply = await channel.checkQueue(queue);
    return { messageCount: reply.messageCount, consumerCount: reply.consumerCount };
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Waits until no message of the queue is ready on that node (a quorum queue answers the same on every node). */
export async function waitForEmptyAt(url: string, queue: string, timeoutMs = 120_000, socket: SocketOptions = {}): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    // A node that just lost the queue's leader may refuse the passive declare for a moment.
    const ready = await queueStateAt(url, queue, socket).then(
      (state) => state.messageCount,
      () => null,
    );
    if (ready === 0) return;
    if (Date.now() > deadline) throw new Error(`queue ${queue} at ${url} still has ready messages (${ready}) after ${timeoutMs} ms`);
    await sleep(200);
  }
}

/** Runs a daemon until nothing is ready, stops it with SIGTERM and repeats if anything came back; the exits. */
export async function drainAt(
  env: Record<string, string>,
  url: string,
  queue: string,
  socket: SocketOptions = {},
): Promise<Array<{ code: number | null; signal: NodeJS.Signals | null }>> {
  const exits = [];
  for (let round = 0; round < 5; round++) {
    const daemon = await startDaemon(env);
    await waitForEmptyAt(url, queue, 120_000, socket);
    await sleep(300);
    exits.push(await stopDaemon(daemon));
    if ((await queueStateAt(url, queue, socket)).messageCount === 0) return exits;
  }
  throw new Error(`queue ${queue} did not drain`);
}

interface StatusDaemon {
  readonly pid: number;
  readonly consuming: boolean;
  readonly amqp_node: string | null;
}

/** The daemons `tally status --json` lists, with the broker node each one is on. */
export async function statusDaemons(env: Record<string, string>): Promise<StatusDaemon[]> {
  const { stdout, code, stderr } = await tallyCli(env, 'status', '--json');
  if (code !== 0) throw new Error(`tally status exited ${code}: ${stderr}`);
  return (JSON.parse(stdout) as { daemons: StatusDaemon[] }).daemons;
}

/** Waits until `tally status` shows the daemon of `pid` consuming on a node other than `not`; that node. */
export async function waitForNodeOf(env: Record<string, string>, pid: number, not: string | null = null, timeoutMs = 60_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const daemon = (await statusDaemons(env)).find((d) => d.pid === pid);
    if (daemon?.consuming && daemon.amqp_node !== null && daemon.amqp_node !== not) return daemon.amqp_node;
    if (Date.now() > deadline) throw new Error(`tally status did not show daemon ${pid} consuming on a node other than ${not}: ${JSON.stringify(daemon)}`);
    await sleep(250);
  }
}
