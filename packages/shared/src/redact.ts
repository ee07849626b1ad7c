import { isSentinelUrl, parseSentinelUrl, type SentinelTarget } from './sentinel-url.js';
import { joinAddress } from './sentinel-state.js';

/**
 * Credentials must never reach a log line. URLs are the usual carrier
 * (amqp://user:secret@host), so every URL that is logged passes through here.
 */
export function redactUrl(raw: string): string {
  if (isSentinelUrl(raw)) return redactSentinelUrl(raw);
  // A TALLY_REDIS_URL list of cluster seeds, or a TALLY_AMQP_URL list of
  // broker nodes: each URL redacted on its own (the fallback below would
  // strip the first userinfo only).
  const urls = raw.split(/,\s*(?=(?:rediss?|amqps?):\/\/)/i);
  if (urls.length > 1) return urls.map(redactOne).join(',');
  return redactOne(raw);
}

function redactOne(raw: string): string {
  try {
    const url = new URL(raw);
    if (url.password) url.password = '***';
    if (url.username && url.password === '') {
      // A bare token in the user slot (redis://token@host) is a secret too.
      if (url.protocol.startsWith('redis')) url.username = '***';
    }
    return url.toString();
  } catch {
    // Not parseable as a URL: strip anything that looks like userinfo.
    return raw.replace(/\/\/[^@/]*@/, '//***@');
  }
}

/**
 * redis+sentinel://user:secret@h1:26379,h2:26379/master?sentinelPassword=secret.
 * `new URL` cannot parse the host list: the URL is parsed as the config
 * parses it and written back with both passwords masked. One that does not
 * parse (the config refuses it anyway) is masked whole after its scheme,
 * rather than guess where a password with unencoded delimiters ends.
 */
function redactSentinelUrl(raw: string): string {
  const scheme = raw
    .trim()
    .slice(0, raw.trim().indexOf('://') + 3)
    .toLowerCase();
  let target: SentinelTarget;
  try {
    target = parseSentinelUrl(raw);
  } catch {
    return `${scheme}***`;
  }
  const user = target.password !== null ? `${encodeURIComponent(target.username ?? '')}:***@` : target.username !== null ? '***@' : '';
  const hosts = target.sentinels.map((s) => joinAddress(s.host, s.port)).join(',');
  const query = [
    ...(target.sentinelUsername === null ? [] : [`sentinelUsername=${encodeURIComponent(target.sentinelUsername)}`]),
    ...(target.sentinelPassword === null ? [] : ['sentinelPassword=***']),
  ];
  const db = target.db === 0 ? '' : `/${target.db}`;
  return `${scheme}${user}${hosts}/${encodeURIComponent(target.masterName)}${db}${query.length === 0 ? '' : `?${query.join('&')}`}`;
}
