/**
 * TALLY_AMQP_URL as a list of the nodes of one RabbitMQ cluster: how the
 * text splits into URLs, what the list must agree on, and which node comes
 * next when a connection is lost. Pure; config.ts reads the variable.
 */
import { ConfigError } from './errors.js';

/**
 * Splits a TALLY_AMQP_URL list into its URLs. A comma starts a new URL only
 * when an `amqp://` or `amqps://` scheme (any case) follows it, so a comma
 * inside a password (allowed unencoded in userinfo) does not split it.
 */
export function splitAmqpUrls(raw: string): string[] {
  // A URL never ends in its password (a host follows), so trailing commas are no part of one.
  return raw
    .replace(/(,\s*)+$/, '')
    .split(/,\s*(?=amqps?:\/\/)/i)
    .map((part) => part.trim())
    .filter((part) => part !== '');
}

/** The parts of a node's URL the nodes of one list must agree on. */
interface NodeIdentity {
  readonly scheme: string;
  readonly username: string;
  readonly password: string;
  readonly vhost: string;
}

function identityOf(url: URL): NodeIdentity {
  // As amqplib reads it: no path (or "/") is the default vhost "/", and so is "/%2F".
  let vhost: string;
  try {
    vhost = decodeURIComponent(url.pathname.slice(1));
  } catch {
    vhost = url.pathname.slice(1);
  }
  return { scheme: url.protocol, username: url.username, password: url.password, vhost: vhost === '' ? '/' : vhost };
}

/**
 * Validates TALLY_AMQP_URL: one URL, or several comma-separated nodes of one
 * cluster. Each entry must be an `amqp://` or `amqps://` URL with a host.
 * The nodes of a list must agree on
 *
 * - the scheme: one cluster is reached one way; a list mixing `amqps://` and
 *   `amqp://` would send the password in the clear whenever the daemon moves
 *   to a plaintext node;
 * - the user, the password and the vhost, written out on every entry (or on
 *   none, for guest and `/`): the queue and its permissions live in one
 *   vhost of the cluster, and an entry without credentials would log in as
 *   guest without a word.
 *
 * Returns the URLs with their scheme lower-cased (`lowerScheme`), in the
 * order given. Errors name the entry by position, never by its text: it may
 * hold a password.
 */
export function validateAmqpNodes(variable: string, raw: string, lowerScheme: (url: string) => string): string[] {
  const entries = splitAmqpUrls(raw);
  if (entries.length === 0) throw new ConfigError(variable, 'expected an amqp:// or amqps:// URL, or several comma-separated nodes of one cluster');
  const parsed = entries.map((entry, i) => {
    const where = entries.length === 1 ? '' : ` (node ${i + 1} of ${entries.length})`;
    let url: URL;
    try {
      url = new URL(entry);
    } catch {
      // The raw value may hold a password: never echo it back.
      throw new ConfigError(variable, `not a valid URL${where}; expected amqp://… or amqps://…, comma-separated for several nodes of one cluster`);
    }
    if (url.protocol !== 'amqp:' && url.protocol !== 'amqps:') {
      throw new ConfigError(variable, `unsupported scheme ${JSON.stringify(url.protocol)}${where}; expected one of amqp:, amqps:`);
    }
    if (url.hostname === '') throw new ConfigError(variable, `no host${where}`);
    return identityOf(url);
  });
  const first = parsed[0]!;
  parsed.forEach((node, i) => {
    if (i === 0) return;
    const where = `node ${i + 1} of ${entries.length}`;
    if (node.scheme !== first.scheme) {
      throw new ConfigError(
        variable,
        `${where} uses ${node.scheme}// but node 1 uses ${first.scheme}//; every node of a cluster is reached the same way (a plaintext node would see the password)`,
      );
    }
    if (node.username !== first.username || node.password !== first.password) {
      throw new ConfigError(variable, `${where} names other credentials than node 1; write the same user:password@ on every node (or on none, for guest)`);
    }
    if (node.vhost !== first.vhost) {
      throw new ConfigError(variable, `${where} names another vhost than node 1; the nodes of one cluster serve Tally's queue from one vhost`);
    }
  });
  return entries.map(lowerScheme);
}

/**
 * The node to try after `index` (a lost connection, or a failed connect):
 * the next one in the list, round and round. With one node it is that node.
 */
export function nextNodeIndex(index: number, count: number): number {
  if (!Number.isSafeInteger(count) || count < 1) throw new RangeError(`a node list has at least one node, got ${count}`);
  return (index + 1) % count;
}
