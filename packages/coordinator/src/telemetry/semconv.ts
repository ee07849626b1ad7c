/**
 * The OpenTelemetry semantic-convention names Tally uses, from the
 * @opentelemetry/semantic-conventions package rather than typed by hand, so
 * a typo cannot drift from what backends expect. The messaging group is
 * still "incubating" upstream: it comes from the `/incubating` entry, pinned
 * by the package version in the lockfile.
 */
export { ATTR_ERROR_TYPE, ATTR_SERVICE_NAME } from '@opentelemetry/semantic-conventions';
export {
  ATTR_MESSAGING_BATCH_MESSAGE_COUNT,
  ATTR_MESSAGING_DESTINATION_NAME,
  ATTR_MESSAGING_MESSAGE_ID,
  ATTR_MESSAGING_OPERATION_NAME,
  ATTR_MESSAGING_OPERATION_TYPE,
  ATTR_MESSAGING_SYSTEM,
  MESSAGING_OPERATION_TYPE_VALUE_PROCESS,
  MESSAGING_OPERATION_TYPE_VALUE_SEND,
  MESSAGING_SYSTEM_VALUE_RABBITMQ,
  METRIC_MESSAGING_CLIENT_CONSUMED_MESSAGES,
  METRIC_MESSAGING_PROCESS_DURATION,
} from '@opentelemetry/semantic-conventions/incubating';
