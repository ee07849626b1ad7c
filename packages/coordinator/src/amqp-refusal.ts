/** RabbitMQ's refusals, told apart from outages by their AMQP reply code. */

/**
 * AMQP reply codes that no reconnect will fix: the broker refuses Tally's
 * credentials or permissions (403 ACCESS_REFUSED), the operation itself
 * (530 NOT_ALLOWED) or a queue's arguments (406 PRECONDITION_FAILED).
 */
const REFUSAL_REPLY_CODES: ReadonlySet<number> = new Set([403, 406, 530]);

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

/** An error no reconnect will fix: the start fails instead of retrying forever. */
export function isAmqpRefusal(error: unknown): boolean {
  const code = amqpReplyCode(error);
  return code !== null && REFUSAL_REPLY_CODES.has(code);
}
