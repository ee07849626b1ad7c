/**
 * Server-side scripts: how they reach Redis. EVALSHA with a SHA1 computed
 * here; on NOSCRIPT (a fresh or restarted Redis, SCRIPT FLUSH) SCRIPT LOAD
 * and the same call again. Not ioredis `defineCommand`: its silent EVAL
 * fallback would hide a Redis that keeps losing its script cache; here every
 * reload after the first is logged.
 *
 * Scripts are used for their cost as much as for atomicity: one EVALSHA
 * carrying a whole batch replaces hundreds of client-side command objects,
 * which is where a worker thread spent most of its time.
 */
import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import { ReplyError } from 'ioredis';

export interface LuaScript {
  readonly name: string;
  readonly source: string;
  readonly sha: string;
  /** The warning logged when Redis lost the script after this client had loaded it. */
  readonly lostMessage: string;
}

export function defineScript(name: string, source: string, lostMessage = 'redis lost a script (restart or SCRIPT FLUSH); loading it again'): LuaScript {
  return Object.freeze({ name, source, sha: createHash('sha1').update(source).digest('hex'), lostMessage });
}

export interface ScriptLog {
  warn(fields: Record<string, unknown>, message: string): void;
}

/** Per client, the scripts it has loaded once: a NOSCRIPT after that means Redis lost its script cache. */
const loaded = new WeakMap<Redis, Set<string>>();

function isNoScript(error: unknown): boolean {
  return error instanceof ReplyError && (error as Error).message.startsWith('NOSCRIPT');
}

/** EVALSHA args: sha, key count, keys, argv. Built with push: a big batch exceeds what a spread call can take. */
export function evalshaArgs(script: LuaScript, keys: readonly string[], argv: readonly (string | number)[]): Array<string | number> {
  const args: Array<string | number> = [script.sha, keys.length];
  for (const key of keys) args.push(key);
  for (const value of argv) args.push(value);
  return args;
}

/** Runs a script, loading it first if Redis does not have it. Other errors propagate to the caller's retry loop. */
export async function runScript(redis: Redis, script: LuaScript, args: Array<string | number>, log: ScriptLog): Promise<unknown> {
  let scripts = loaded.get(redis);
  if (scripts === undefined) {
    scripts = new Set();
    loaded.set(redis, scripts);
  }
  try {
    const reply = await redis.call('EVALSHA', args);
    scripts.add(script.sha);
    return reply;
  } catch (error) {
    if (!isNoScript(error)) throw error;
    if (scripts.has(script.sha)) log.warn({ script: script.name, sha: script.sha }, script.lostMessage);
    const sha = await redis.script('LOAD', script.source);
    // A different SHA would make every call NOSCRIPT forever: a bug, not an outage.
    if (sha !== script.sha) throw new Error(`SCRIPT LOAD of ${script.name} returned ${String(sha)}, expected ${script.sha}`);
    scripts.add(script.sha);
    return redis.call('EVALSHA', args);
  }
}
