/** The bench's few direct RabbitMQ operations besides publishing. */
import amqp from 'amqplib';

export async function withChannel<T>(url: string, run: (channel: amqp.Channel) => Promise<T>): Promise<T> {
  const connection = await amqp.connect(url, { clientProperties: { connection_name: 'tally-bench-control' } });
  try {
    const channel = await connection.createChannel();
    channel.on('error', () => {});
    return await run(channel);
  } finally {
    await connection.close().catch(() => {});
  }
}

/** Ready messages (unacked ones not included) and consumers of a queue. */
export async function queueState(url: string, queue: string): Promise<{ messageCount: number; consumerCount: number }> {
  return withChannel(url, async (channel) => {
    const reply = await channel.checkQueue(queue);
    return { messageCount: reply.messageCount, consumerCount: reply.consumerCount };
  });
}

/** Deletes a bench queue and its dead-letter queue (the daemon declares `<queue>.dead`). */
export async function deleteBenchQueues(url: string, queue: string): Promise<void> {
  await withChannel(url, async (channel) => {
    await channel.deleteQueue(queue).catch(() => {});
    await channel.deleteQueue(`${queue}.dead`).catch(() => {});
  }).catch(() => {});
}
