/**
 * JSON Pointer (RFC 6901): the syntax of the paths a message mapping names,
 * and their resolution against a value JSON.parse returned. Pure.
 *
 * A pointer is `""` (the whole document) or a sequence of `/token`; inside a
 * token `~1` stands for `/` and `~0` for `~`, and any other `~` is an error.
 * A token addresses an object's own member by name, or an array's element
 * by a decimal index without leading zeros (`-`, "past the end", addresses
 * nothing when reading).
 */

export type PointerTokens = readonly string[];

/** Why a text is not a JSON Pointer, or the pointer's unescaped tokens. */
export type PointerSyntax = { readonly ok: true; readonly tokens: PointerTokens } | { readonly ok: false; readonly problem: string };

export function parseJsonPointer(text: string): PointerSyntax {
  if (text === '') return { ok: true, tokens: [] };
  if (text[0] !== '/') return { ok: false, problem: `a JSON Pointer starts with "/", got ${JSON.stringify(text)}` };
  const tokens: string[] = [];
  for (const raw of text.slice(1).split('/')) {
    // Every "~" must start "~0" or "~1" (RFC 6901 section 3).
    const stray = /~(?![01])/.exec(raw);
    if (stray !== null) return { ok: false, problem: `"~" must be followed by 0 or 1 (~0 is "~", ~1 is "/") in ${JSON.stringify(text)}` };
    // ~1 first would turn "~01" into "/" instead of "~1" (section 4).
    tokens.push(raw.replaceAll('~1', '/').replaceAll('~0', '~'));
  }
  return { ok: true, tokens };
}

/** The pointer text of some tokens, escaped: the inverse of parseJsonPointer. */
export function formatJsonPointer(tokens: PointerTokens): string {
  let text = '';
  for (const token of tokens) text += `/${token.replaceAll('~', '~0').replaceAll('/', '~1')}`;
  return text;
}

/** An array index token: "0", or digits without a leading zero (section 4). */
const ARRAY_INDEX = /^(?:0|[1-9]\d*)$/;

/**
 * The value the tokens address in `root`, from `from` on, or undefined when
 * they address nothing (a missing member, an index out of range, a step into
 * a string or number). JSON.parse gives `undefined` to nothing, so absence
 * is unambiguous. Only own members count: a body's `"__proto__"` or
 * `"constructor"` never reaches Object.prototype.
 */
export function resolvePointer(root: unknown, tokens: PointerTokens, from = 0): unknown {
  let value = root;
  for (let i = from; i < tokens.length; i++) {
    const token = tokens[i]!;
    if (Array.isArray(value)) {
      if (!ARRAY_INDEX.test(token)) return undefined;
      const index = Number(token);
      if (index >= value.length) return undefined;
      value = value[index];
    } else if (value !== null && typeof value === 'object') {
      if (!Object.hasOwn(value, token)) return undefined;
      value = (value as Record<string, unknown>)[token];
    } else return undefined;
  }
  return value;
}
