#!/usr/bin/env node
// Demo and bench helper: empties TALLY_QUEUE, its dead-letter queue and TALLY_PREFIX.
import { DEFAULTS } from '@tally/shared';
import { resetNamespace } from '@tally/testkit';

const prefix = process.env.TALLY_PREFIX;
const queue = process.env.TALLY_QUEUE;
if (!prefix || !queue || prefix === DEFAULTS.prefix || queue === DEFAULTS.queue) {
  process.stderr.write('reset-namespace: refusing to reset without an explicit, non-default TALLY_PREFIX and TALLY_QUEUE\n');
  process.exit(2);
}
await resetNamespace({
  amqpUrl: process.env.TALLY_AMQP_URL ?? DEFAULTS.amqpUrl,
  redisUrl: process.env.TALLY_REDIS_URL ?? DEFAULTS.redisUrl,
  queue,
  prefix,
});
