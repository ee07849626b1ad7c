/**
 * How a CLI command reaches RabbitMQ: the nodes of TALLY_AMQP_URL in order,
 * one attempt each, the first that answers wins. A command is short and
 * started by hand, so there is no backoff and no second round; the daemon's
 * own reconnects are in broker-connection.ts.
 */
import amqp, { type ChannelModel } from 'amqplib';
import { describeError, redactUrl, splitAmqpUrls, TallyError } from '@tally/shared';
import { brokerTlsRefusal } from './broker-refusal.js';

export interface BrokerConnection {
  readonly model: ChannelModel;
  /** The node it reached, as given (log it only through redactUrl). */
  readonly node: string;
}

/**
 * Connects to the first node that answers, in the order given. Every node failing throws
 * TALLY_AMQP_UNAVAILABLE naming each node (redacted) and its reason; a
 * certificate refusal throws TALLY_AMQP_TLS with the fix at once, since no
 * other node of the cluster is reached another way.
 */
export async function connectAnyNode(urls: readonly string[] | string, connectionName: string): Promise<BrokerConnection> {
  // TALLY_AMQP_URL as its text (config.amqpUrl) or as its list (config.amqpNodes).
  const nodes = typeof urls === 'string' ? splitAmqpUrls(urls) : urls;
  const failures: string[] = [];
  for (const node of nodes) {
    try {
      return { model: await amqp.connect(node, { clientProperties: { connection_name: connectionName } }), node };
    } catch (error) {
      const tls = brokerTlsRefusal(error);
      if (tls !== null) throw new TallyError('TALLY_AMQP_TLS', `${tls} (broker ${redactUrl(node)})`, { cause: error });
      failures.push(`${redactUrl(node)}: ${describeError(error)}`);
    }
  }
  const which = nodes.length === 1 ? `RabbitMQ at ${failures[0]}` : `no node of TALLY_AMQP_URL answered (${failures.join('; ')})`;
  throw new TallyError('TALLY_AMQP_UNAVAILABLE', which);
}
