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
 *
 * The scripts are files, `lua/<name>.lua`, each with its KEYS and ARGV in a
 * header comment. They are read once, when this module loads, from beside
 * the compiled module (the build copies `src/lua` to `dist/src/lua`), and the
 * SHA is computed from exactly the text that SCRIPT LOAD sends.
 *
 * Redis scripts cannot call one another, so helpers several scripts need
 * live in `lua/include/<name>.lua` and a line `-- @include <name>` is
 * replaced by that file's text: one copy of the marker bucket arithmetic
 * and of the all-or-nothing increments, not one per script.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Redis } from 'ioredis';
import { ReplyError } from 'ioredis';
import type { BatchLog } from './batch-log.js';

export interface LuaScript {
  readonly name: string;
  readonly source: string;
  readonly sha: string;
  /** The warning logged when Redis lost the script after this client had loaded it. */
  readonly lostMessage: string;
}

const DEFAULT_LOST_MESSAGE = 'redis lost a script (restart or SCRIPT FLUSH); loading it again';

/** A script from its source text; the SHA is that of the exact text. */
export function defineScript(name: string, source: string, lostMessage = DEFAULT_LOST_MESSAGE): LuaScript {
  return Object.freeze({ name, source, sha: createHash('sha1').update(source).digest('hex'), lostMessage });
}

const INCLUDE_LINE = /^-- @include ([a-z_]+)$/gm;

/** A script's text with each `-- @include <name>` line replaced by `lua/include/<name>.lua` (one level: includes include nothing). */
export function expandIncludes(source: string, readInclude: (name: string) => string): string {
  return source.replace(INCLUDE_LINE, (_, name: string) => {
    const included = readInclude(name);
    if (/^-- @include /m.test(included)) throw new Error(`lua/include/${name}.lua includes another file: one level only`);
    return included.trimEnd();
  });
}

function readLua(path: string): string {
  return readFileSync(new URL(`./lua/${path}.lua`, import.meta.url), 'utf8');
}

/** Reads `lua/<name>.lua` next to this module, its includes expanded. Synchronous: it runs once per thread, at import. */
export function loadScript(name: string, lostMessage = DEFAULT_LOST_MESSAGE): LuaScript {
  return defineScript(
    name,
    expandIncludes(readLua(name), (included) => readLua(`include/${included}`)),
    lostMessage,
  );
}

/** Per client, the scripts it has loaded once: a NOSCRIPT after that means Redis lost its script cache. */
const loaded = new WeakMap<Redis, Set<string>>();

export function isNoScript(error: unknown): boolean {
  return error instanceof ReplyError && (error as Error).message.startsWith('NOSCRIPT');
}

/** SCRIPT LOAD on this connection's server; a different SHA would make every call NOSCRIPT forever: a bug, not an outage. */
export async function loadScriptInto(redis: Redis, script: LuaScript): Promise<void> {
  const sha = await redis.script('LOAD', script.source);
  if (sha !== script.sha) throw new Error(`SCRIPT LOAD of ${script.name} returned ${String(sha)}, expected ${script.sha}`);
}
/** An EVALSHA argument: binary ones (marker digests) go as Buffers, byte for byte. */
export type ScriptArg = string | number | Buffer;

/** EVALSHA args: sha, key count, keys, argv. Built with push: a big batch exceeds what a spread call can take. */
export function evalshaArgs(script: LuaScript, keys: readonly string[], argv: readonly ScriptArg[]): ScriptArg[] {
  const args: ScriptArg[] = [script.sha, keys.length];
  for (const key of keys) args.push(key);
  for (const value of argv) args.push(value);
  return args;
}

/** Runs a script, loading it first if Redis does not have it. Other errors propagate to the caller's retry loop. */
export async function runScript(redis: Redis, script: LuaScript, args: ScriptArg[], log: Pick<BatchLog, 'warn'>): Promise<unknown> {
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
    await loadScriptInto(redis, script);
    scripts.add(script.sha);
    return redis.call('EVALSHA', args);
  }
}
