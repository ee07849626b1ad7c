/**
 * RabbitMQ refusals that no reconnect fixes, turned into one line naming the
 * fix (a vhost or permission the user lacks). Pure: takes the error amqplib raised and what Tally
 * asked for; returns null for anything that may pass by itself (a refused or
 * dropped TCP connection, a broker restarting), which the caller retries.
 *
 * Refusals are told apart by their AMQP reply code (amqpReplyCode), never
 * by words in the text: amqplib puts the code on the error of a channel the
 * broker closed, as `code`:
 *   Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - access to queue 'q' ..."
 * A connection refused after login (vhost missing or not permitted) has no
 * code at all, because amqplib drops the broker's frame during the opening
 * handshake; only the frame's name is left:
 *   Expected ConnectionOpenOk; got <ConnectionClose channel:0>
 *
 * A TLS handshake the client itself refused (a certificate it does not
 * trust, or one for another host) and `amqps://` aimed at a plaintext port
 * are told by Node's error code; they are configuration too, as they are
 * for Redis (redis-requirements.ts), so they stop the start the same way.
 */
import { describeError, tlsTrustFailure } from '@tally/shared';

export interface BrokerTarget {
  readonly url: string;
  readonly queue: string;
  readonly deadLetterQueue: string;
}

/** AMQP reply codes (AMQP 0-9-1 constants). */
const ACCESS_REFUSED = 403;
const RESOURCE_LOCKED = 405;
const PRECONDITION_FAILED = 406;
const NOT_ALLOWED = 530;
const COMMAND_INVALID = 503;

/**
 * The AMQP reply code an amqplib error carries: `code` on the errors of a
 * channel or connection the broker closed. A close during the opening
 * handshake (a refused login) has no `code`; amqplib writes the reply code
 * at a fixed place in that error's message instead, and only there is it read.
 */
export function amqpReplyCode(error: unknown): number | null {
  if (!(error instanceof Error)) return null;
  const { code } = error as { code?: unknown };
  if (typeof code === 'number') return code;
  const handshake = /^Handshake terminated by server: (\d{3}) /.exec(error.message);
  return handshake ? Number(handshake[1]) : null;
}

/** The broker's own text, `ACCESS_REFUSED - access to queue ...`, when amqplib kept it. */
function brokerText(message: string): string {
  const quoted = /with message "([^"]*)"/.exec(message);
  return (quoted?.[1] ?? message).replace(/\s+/g, ' ').trim();
}

function userAndVhost(url: string): { user: string; vhost: string } {
  try {
    const parsed = new URL(url);
    const path = decodeURIComponent(parsed.pathname.replace(/^\//, ''));
    return { user: decodeURIComponent(parsed.username) || 'guest', vhost: path === '' ? '/' : path };
  } catch {
    return { user: '<user>', vhost: '/' };
  }
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** The permissions Tally needs, as a rabbitmqctl line an operator can paste. */
export function permissionFix(target: BrokerTarget): string {
  const { user, vhost } = userAndVhost(target.url);
  const queues = `^${escapeRegExp(target.queue)}(\\.dead)?$`;
  // configure: declare both queues; write: publish dead letters through the
  // default exchange; read: consume the work queue.
  return `rabbitmqctl set_permissions -p '${vhost}' '${user}' '${queues}' '^(amq\\.default|${escapeRegExp(target.queue)}\\.dead)$' '${queues}'`;
}

/** One line with the fix, or null when the error may pass by itself. */
export function brokerRefusal(error: unknown, target: BrokerTarget): string | null {
  const message = describeError(error);
  const text = brokerText(message);
  const code = amqpReplyCode(error);
  if (code === ACCESS_REFUSED && message.startsWith('Handshake terminated by server')) {
    return `RabbitMQ refused the login (${text}); put the right user and password in TALLY_AMQP_URL (amqp://user:password@host:port/vhost)`;
  }
  if (code === NOT_ALLOWED || /^Expected ConnectionOpenOk; got <ConnectionClose/.test(message)) {
    const { user, vhost } = userAndVhost(target.url);
    return `RabbitMQ refused user '${user}' access to vhost '${vhost}' (NOT_ALLOWED); fix the vhost in TALLY_AMQP_URL, or create it and grant access: ${permissionFix(target)}`;
  }
  if (code === ACCESS_REFUSED) {
    return `RabbitMQ refused Tally (${text}); grant the permissions Tally needs: ${permissionFix(target)}`;
  }
  if (code === PRECONDITION_FAILED) {
    return (
      `RabbitMQ refused a queue Tally declares (${text}); the queue exists with other arguments: ` +
      `declare it to match, delete it, or set TALLY_QUEUE to another name`
    );
  }
  if (code === COMMAND_INVALID && /(unknown|invalid) exchange type 'x-consistent-hash'/.test(text)) {
    return (
      `RabbitMQ does not know the exchange type x-consistent-hash that TALLY_PARTITIONS > 1 needs (${text}); ` +
      `enable the plugin on every node: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`
    );
  }
  if (code === RESOURCE_LOCKED) {
    return `RabbitMQ refused Tally (${text}); the queue is exclusive to another connection: set TALLY_QUEUE to another name`;
  }
  return null;
}

/** A certificate refusal (or TLS aimed at a plaintext port): one line naming the fix, or null. */
export function brokerTlsRefusal(error: unknown): string | null {
  if (!(error instanceof Error)) return null;
  const { code } = error as { code?: unknown };
  const message = error.message.replace(/\s+/g, ' ').trim();
  const failure = tlsTrustFailure(code);
  if (failure === 'untrusted') {
    return `the TLS certificate of RabbitMQ is not trusted (${String(code)}: ${message}); for a private CA set NODE_EXTRA_CA_CERTS=/path/to/ca.pem (verification stays on)`;
  }
  if (failure === 'host-mismatch') {
    return `the TLS certificate of RabbitMQ does not name the host in TALLY_AMQP_URL (${message}); use a host name or IP the certificate lists`;
  }
  if (code === 'ERR_SSL_WRONG_VERSION_NUMBER' || /wrong version number|packet length too long|unknown protocol/i.test(message)) {
    return `the RabbitMQ port does not speak TLS (${message}); use the broker's TLS listener (5671 by default) with amqps://, or amqp:// for a plaintext port`;
  }
  return null;
}

/** What stops the start: the error code for the refusal and its line. */
export interface BrokerRefusal {
  readonly code: 'TALLY_AMQP_REFUSED' | 'TALLY_AMQP_TLS';
  readonly line: string;
}

/** A refusal no reconnect fixes, TLS or AMQP, or null for anything that may pass by itself. */
export function classifyBrokerRefusal(error: unknown, target: BrokerTarget): BrokerRefusal | null {
  const tls = brokerTlsRefusal(error);
  if (tls !== null) return { code: 'TALLY_AMQP_TLS', line: tls };
  const line = brokerRefusal(error, target);
  return line === null ? null : { code: 'TALLY_AMQP_REFUSED', line };
}
