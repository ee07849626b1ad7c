/**
 * Credentials must never reach a log line. URLs are the usual carrier
 * (amqp://user:secret@host), so every URL that is logged passes through here.
 */
export function redactUrl(raw: string): string {
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
