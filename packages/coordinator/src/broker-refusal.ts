/**
 * RabbitMQ refusals that no reconnect fixes, turned into one line naming the
 * fix (issue 9, case 10). Pure: takes the error amqplib raised and what Tally
 * asked for; returns null for anything that may pass by itself (a refused or
 * dropped TCP connection, a broker restarting), which the caller retries.
 *
 * amqplib reports a channel closed by the broker as
 *   Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - access to queue 'q' ..."
 * and a connection refused after login (vhost missing or not permitted) only as
 *   Expected ConnectionOpenOk; got <ConnectionClose channel:0>
 * because it drops the broker's text during the opening handshake.
 */
export interface BrokerTarget {
  readonly url: string;
  readonly queue: string;
  readonly deadLetterQueue: string;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
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
  const message = describe(error);
  const text = brokerText(message);
  if (/ACCESS[-_]REFUSED/.test(message) && /Login was refused|authentication|Handshake terminated/i.test(message)) {
    return `RabbitMQ refused the login (${text}); put the right user and password in TALLY_AMQP_URL (amqp://user:password@host:port/vhost)`;
  }
  if (/Expected ConnectionOpenOk; got <ConnectionClose/.test(message) || /NOT[-_]ALLOWED/.test(message)) {
    const { user, vhost } = userAndVhost(target.url);
    return `RabbitMQ refused user '${user}' access to vhost '${vhost}' (NOT_ALLOWED); fix the vhost in TALLY_AMQP_URL, or create it and grant access: ${permissionFix(target)}`;
  }
  if (/ACCESS[-_]REFUSED/.test(message)) {
    return `RabbitMQ refused Tally (${text}); grant the permissions Tally needs: ${permissionFix(target)}`;
  }
  if (/PRECONDITION[-_]FAILED/.test(message)) {
    return (
      `RabbitMQ refused a queue Tally declares (${text}); the queue exists with other arguments: ` +
      `declare it to match, delete it, or set TALLY_QUEUE to another name`
    );
  }
  if (/RESOURCE[-_]LOCKED/.test(message)) {
    return `RabbitMQ refused Tally (${text}); the queue is exclusive to another connection: set TALLY_QUEUE to another name`;
  }
  return null;
}
