/**
 * TALLY_REDIS_URL naming a Redis behind Sentinel (docs/scale-out.md, "Redis
 * Sentinel"):
 *
 *   redis+sentinel://[user:password@]host[:port][,host[:port]…]/master-name[/db][?sentinelPassword=…&sentinelUsername=…]
 *   rediss+sentinel://…  TLS to the Sentinels and to the data nodes
 *
 * The user and password are the data nodes' (the primary and its replicas),
 * as in redis://. A Sentinel has its own `requirepass`, so its credentials
 * are named apart, in the query. One URL carries everything, so the daemon,
 * its worker threads and the CLI all build their clients from the one
 * string (runtime/src/redis-connection.ts) and nothing is passed beside it.
 *
 * `new URL` cannot parse a host list (it reads `a:26379,b:26379` as a port),
 * so this parser splits the authority itself and leaves the path and the
 * query to `new URL`. As in any URL, a password holding `@ / ? # %` must be
 * percent-encoded. Errors never echo the value: it may hold a password.
 * Pure.
 */
import { ConfigError } from './errors.js';

/** The Sentinel port when a host names none (Redis's default). */
export const DEFAULT_SENTINEL_PORT = 26379;

const SENTINEL_SCHEME = /^(rediss?)\+sentinel:\/\//i;
/** Query parameters the URL may carry; anything else is refused, so a typo is not silently ignored. */
const QUERY_KEYS: readonly string[] = Object.freeze(['sentinelUsername', 'sentinelPassword']);

export interface SentinelAddress {
  readonly host: string;
  readonly port: number;
}

export interface SentinelTarget {
  /** rediss+sentinel://: TLS to the Sentinels and to the data nodes. */
  readonly tls: boolean;
  readonly sentinels: readonly SentinelAddress[];
  /** The master group name of `sentinel monitor <name> …`. */
  readonly masterName: string;
  readonly db: number;
  /** The data nodes' user and password (userinfo), decoded; null when absent. */
  readonly username: string | null;
  readonly password: string | null;
  readonly sentinelUsername: string | null;
  readonly sentinelPassword: string | null;
}

/** Whether a TALLY_REDIS_URL names Sentinels (redis+sentinel:// or rediss+sentinel://). */
export function isSentinelUrl(raw: string): boolean {
  return SENTINEL_SCHEME.test(raw.trim());
}

/** Parses a Sentinel URL; a ConfigError naming `variable` when it is not one Tally can use. */
export function parseSentinelUrl(raw: string, variable = 'TALLY_REDIS_URL'): SentinelTarget {
  const fail = (why: string): never => {
    throw new ConfigError(variable, `${why}; expected redis+sentinel://[user:password@]host:26379,host:26379/master-name (rediss+sentinel:// for TLS)`);
  };
  const text = raw.trim();
  const scheme = SENTINEL_SCHEME.exec(text);
  if (scheme === null) return fail('not a Sentinel URL');
  const rest = text.slice(scheme[0].length);
  // The authority ends at the first / ? or # (an encoded password holds none of them); its userinfo at its last @.
  const slash = rest.search(/[/?#]/);
  const authority = slash === -1 ? rest : rest.slice(0, slash);
  const at = authority.lastIndexOf('@');
  const userinfo = at === -1 ? '' : authority.slice(0, at);
  const hostList = authority.slice(at + 1);

  const decode = (part: string, what: string): string => {
    try {
      return decodeURIComponent(part);
    } catch {
      return fail(`the ${what} is not valid percent-encoding`);
    }
  };
  const colon = userinfo.indexOf(':');
  const username = userinfo === '' ? '' : decode(colon === -1 ? userinfo : userinfo.slice(0, colon), 'user');
  const password = colon === -1 ? '' : decode(userinfo.slice(colon + 1), 'password');

  const sentinels = hostList
    .split(',')
    .map((entry, i, all) => parseHostPort(entry.trim(), all.length === 1 ? '' : ` (Sentinel ${i + 1} of ${all.length})`, fail));

  let tail: URL;
  try {
    tail = new URL(`http://host${rest.slice(authority.length)}`);
  } catch {
    return fail('the path or query is not valid');
  }
  const segments = tail.pathname.split('/').filter((segment) => segment !== '');
  if (segments.length === 0) return fail('no master name after the Sentinels');
  if (segments.length > 2) return fail('too many path segments: give /master-name or /master-name/db');
  const masterName = decode(segments[0]!, 'master name');
  let db = 0;
  if (segments.length === 2) {
    if (!/^\d{1,5}$/.test(segments[1]!)) return fail(`database ${JSON.stringify(segments[1])} is not a number`);
    db = Number(segments[1]);
  }
  if (tail.hash !== '') return fail('a fragment (#…) has no meaning here; percent-encode # in a password');

  const query = new Map<string, string>();
  for (const [key, value] of tail.searchParams) {
    if (!QUERY_KEYS.includes(key)) return fail(`unknown parameter ${JSON.stringify(key)} (known: ${QUERY_KEYS.join(', ')})`);
    if (query.has(key)) return fail(`parameter ${key} given twice`);
    query.set(key, value);
  }
  return Object.freeze({
    tls: scheme[1]!.toLowerCase() === 'rediss',
    sentinels: Object.freeze(sentinels),
    masterName,
    db,
    username: username === '' ? null : username,
    password: password === '' ? null : password,
    sentinelUsername: query.get('sentinelUsername') || null,
    sentinelPassword: query.get('sentinelPassword') || null,
  });
}

/** `host`, `host:port`, `[v6]` or `[v6]:port`. */
function parseHostPort(entry: string, where: string, fail: (why: string) => never): SentinelAddress {
  const match = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]@\s]+))(?::(\d{1,5}))?$/.exec(entry);
  if (match === null) return fail(entry === '' ? `an empty Sentinel address${where}` : `not a host or host:port${where}`);
  const port = match[3] === undefined ? DEFAULT_SENTINEL_PORT : Number(match[3]);
  if (port < 1 || port > 65_535) return fail(`port ${port} out of range${where}`);
  return Object.freeze({ host: match[1] ?? match[2]!, port });
}
