/**
 * The broker's side against the real RabbitMQ: refusals at
 * start, a dead-letter queue deleted at run time, and a memory alarm.
 * Users made here are deleted here; the memory watermark is restored in
 * `finally`, since other tests share the broker.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import amqp from 'amqplib';
import { expect } from 'chai';
import {
  cleanup,
  drainQueue,
  queueState,
  runRefusedStart,
  startDaemon,
  stopDaemon,
  testSpace,
  AMQP_URL,
  type DaemonProcess,
  type RefusedStart,
} from './harness.js';

const run = promisify(execFile);

async function rabbitmqctl(...args: string[]): Promise<string> {
  const { stdout } = await run('rabbitmqctl', args, { timeout: 60_000 });
  return stdout;
}

/** A broker user for one test; `permissions` are configure, write, read (null: none on the vhost). */
async function withUser<T>(permissions: readonly [string, string, string] | null, work: (url: string) => Promise<T>): Promise<T> {
  const user = `tally-test-${randomBytes(4).toString('hex')}`;
  const password = randomBytes(8).toString('hex');
  await rabbitmqctl('add_user', user, password);
  try {
    if (permissions !== null) await rabbitmqctl('set_permissions', '-p', '/', user, ...permissions);
    return await work(`amqp://${user}:${password}@127.0.0.1:5672`);
  } finally {
    await rabbitmqctl('delete_user', user);
  }
}

function expectOneLineRefusal(result: RefusedStart, ...mentions: string[]): void {
  expect(result.code, `exit code; stderr: ${result.stderrLines.join('|')}`).to.equal(1);
  expect(result.stderrLines, 'one stderr line, no stack trace').to.have.length(1);
  for (const text of mentions) expect(result.stderrLines[0]).to.include(text);
  expect(result.fatalCode).to.equal('TALLY_AMQP_REFUSED');
  expect(
    result.logs.some((l) => l.includes('amqp connect failed; retrying')),
    'not a retry loop',
  ).to.equal(false);
}

async function publishRaw(queue: string, body: string, messageId: string): Promise<void> {
  const connection = await amqp.connect(AMQP_URL);
  try {
    const channel = await connection.createConfirmChannel();
    channel.sendToQueue(queue, Buffer.from(body), { persistent: true, messageId });
    await channel.waitForConfirms();
  } finally {
    await connection.close();
  }
}

/** Unacked deliveries of a queue, as the broker counts them. */
async function unacked(queue: string): Promise<number> {
  const out = await rabbitmqctl('list_queues', '-q', '--no-table-headers', 'name', 'messages_unacknowledged');
  for (const line of out.split('\n')) {
    const [name, count] = line.trim().split(/\s+/);
    if (name === queue) return Number(count);
  }
  throw new Error(`queue ${queue} not listed`);
}

async function readyz(port: number): Promise<{ status: string; amqp: { blocked: boolean; blockedReason: string | null; unroutableDeadLetters: number } }> {
  return (await (await fetch(`http://127.0.0.1:${port}/readyz`)).json()) as never;
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

describe('broker edges (integration: the real RabbitMQ)', function () {
  this.timeout(180_000);

  describe('refusals at start: exit 1, one line naming the fix', () => {
    it('a user with no access to the vhost (NOT_ALLOWED)', async () => {
      const space = testSpace('amqp-vhost');
      await withUser(null, async (url) => {
        const result = await runRefusedStart({ ...space.env, TALLY_AMQP_URL: url }, 40_000);
        expectOneLineRefusal(result, "vhost '/'", 'rabbitmqctl set_permissions');
        expect(result.stderrLines[0]).not.to.match(/:[0-9a-f]{16}@/); // the password
      });
      await cleanup(space);
    });

    it('a user who may not declare the queues (ACCESS_REFUSED on queue.declare), not an uncaught stack trace', async () => {
      const space = testSpace('amqp-declare');
      try {
        await withUser(['^$', '.*', '.*'], async (url) => {
          const result = await runRefusedStart({ ...space.env, TALLY_AMQP_URL: url }, 40_000);
          expectOneLineRefusal(result, 'ACCESS_REFUSED', `access to queue '${space.queue}`, 'rabbitmqctl set_permissions');
        });
      } finally {
        await cleanup(space);
      }
    });

    it('a user who may not consume the queue (ACCESS_REFUSED on basic.consume)', async () => {
      const space = testSpace('amqp-read');
      try {
        await withUser(['.*', '.*', '^$'], async (url) => {
          const result = await runRefusedStart({ ...space.env, TALLY_AMQP_URL: url }, 40_000);
          expectOneLineRefusal(result, 'ACCESS_REFUSED', space.queue);
        });
      } finally {
        await cleanup(space);
      }
    });

    it('TALLY_PARTITIONS > 1 on a broker without the consistent-hash plugin: the broker closes the connection, the line names the plugin', async () => {
      const space = testSpace('amqp-no-plugin', { TALLY_PARTITIONS: '2' });
      await run('rabbitmq-plugins', ['disable', 'rabbitmq_consistent_hash_exchange'], { timeout: 60_000 });
      try {
        const result = await runRefusedStart(space.env, 40_000);
        expectOneLineRefusal(result, "exchange type 'x-consistent-hash'", 'rabbitmq-plugins enable rabbitmq_consistent_hash_exchange');
      } finally {
        // The other partition tests need it back, whatever happened here.
        await run('rabbitmq-plugins', ['enable', 'rabbitmq_consistent_hash_exchange'], { timeout: 60_000 });
        await cleanup(space);
      }
    });

    it('the permissions the fix line names are enough to run', async () => {
      const space = testSpace('amqp-enough');
      try {
        const queue = space.queue.replace(/[.]/g, '\\.');
        await withUser([`^${queue}(\\.dead)?$`, `^(amq\\.default|${queue}\\.dead)$`, `^${queue}(\\.dead)?$`], async (url) => {
          const daemon = await startDaemon({ ...space.env, TALLY_AMQP_URL: url });
          await publishRaw(space.queue, 'not json', 'bad-1');
          await until('the dead letter', async () => (await queueState(`${space.queue}.dead`)).messageCount === 1);
          expect((await stopDaemon(daemon)).code).to.equal(0);
        });
      } finally {
        await cleanup(space);
      }
    });
  });

  describe('dead letters', () => {
    it('a copy to a deleted .dead queue is returned, never acked as kept: the original waits unacked until the queue is back', async () => {
      const space = testSpace('amqp-unroutable', { TALLY_METRICS_PORT: '0' });
      let daemon: DaemonProcess | null = null;
      try {
        daemon = await startDaemon(space.env);
        const { port } = JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number };
        const admin = await amqp.connect(AMQP_URL);
        try {
          const channel = await admin.createChannel();
          await channel.deleteQueue(`${space.queue}.dead`);
          await publishRaw(space.queue, '{"id": 12, "changes": "nope"}', 'bad-unroutable');
          await daemon.waitForLog('dead-letter copy unroutable');
          await daemon.waitForLog('dead-letter publish not confirmed; retrying');
          // Held, not lost: unacked on the work queue.
          expect(await unacked(space.queue)).to.equal(1);
          expect((await readyz(port)).amqp.unroutableDeadLetters).to.be.at.least(1);
          const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
          expect(metrics).to.match(/^tally_dead_letter_unroutable_total\{[^}]*\} [1-9]\d*$/m);
          // The operator declares it again: the retry routes the copy, then the original is acked.
          await channel.assertQueue(`${space.queue}.dead`, { durable: true });
        } finally {
          await admin.close();
        }
        await until(
          'the copy in .dead and the original acked',
          async () => (await queueState(`${space.queue}.dead`)).messageCount === 1 && (await unacked(space.queue)) === 0,
          30_000,
        );
        expect((await stopDaemon(daemon)).code).to.equal(0);
        const [copy] = await drainQueue(`${space.queue}.dead`);
        expect(copy!.content.toString()).to.equal('{"id": 12, "changes": "nope"}');
        expect(copy!.properties.headers!['x-tally-reason']).to.be.a('string');
        expect(copy!.properties.messageId).to.equal('bad-unroutable');
        expect((await queueState(space.queue)).messageCount).to.equal(0);
      } finally {
        if (daemon) await stopDaemon(daemon);
        await cleanup(space);
      }
    });
  });

  describe('memory alarm', () => {
    it('blocked is logged and shown in /readyz and tally_amqp_blocked; the dead letter waits and lands once unblocked', async () => {
      const space = testSpace('amqp-blocked', { TALLY_METRICS_PORT: '0' });
      let daemon: DaemonProcess | null = null;
      try {
        // Published before the alarm (a blocked test publisher could not), to a queue declared first.
        const admin = await amqp.connect(AMQP_URL);
        await (await admin.createChannel()).assertQueue(space.queue, { durable: true });
        await admin.close();
        await publishRaw(space.queue, 'not json at all', 'bad-blocked');
        let port = 0;
        try {
          await rabbitmqctl('set_vm_memory_high_watermark', '0.0000001');
          daemon = await startDaemon(space.env);
          port = (JSON.parse(await daemon.waitForLog('"msg":"http endpoint listening"')) as { port: number }).port;
          await daemon.waitForLog('amqp connection blocked by the broker', 15_000);
          const ready = await readyz(port);
          expect(ready.amqp.blocked).to.equal(true);
          expect(ready.amqp.blockedReason).to.match(/memory/i);
          expect(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()).to.match(/^tally_amqp_blocked\{[^}]*\} 1$/m);
          // The copy is not confirmed while blocked: the original stays unacked.
          expect((await queueState(`${space.queue}.dead`)).messageCount).to.equal(0);
        } finally {
          await rabbitmqctl('set_vm_memory_high_watermark', '0.4');
        }
        await daemon!.waitForLog('amqp connection unblocked', 30_000);
        expect((await readyz(port)).amqp.blocked).to.equal(false);
        await until('the dead letter', async () => (await queueState(`${space.queue}.dead`)).messageCount === 1, 30_000);
        expect((await stopDaemon(daemon!)).code).to.equal(0);
        expect((await queueState(space.queue)).messageCount).to.equal(0);
      } finally {
        if (daemon) await stopDaemon(daemon);
        await cleanup(space);
      }
    });
  });
});
