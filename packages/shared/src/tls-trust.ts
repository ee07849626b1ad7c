/**
 * TLS verification failures, by Node's error codes: a certificate the
 * process does not trust is configuration (a CA to add, a host name to fix),
 * never an outage, for Redis and RabbitMQ alike. Pure.
 */

/** A certificate chain Node refused to trust. */
export const CERTIFICATE_ERRORS: ReadonlySet<string> = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'CERT_SIGNATURE_FAILURE',
  'INVALID_CA',
]);

/** A certificate that does not name the host it was reached by. */
export const HOST_MISMATCH_ERROR = 'ERR_TLS_CERT_ALTNAME_INVALID';

export type TlsTrustFailure = 'untrusted' | 'host-mismatch';

/** Whether an error's code says the server's certificate was refused, and how; null for anything else. */
export function tlsTrustFailure(code: unknown): TlsTrustFailure | null {
  if (typeof code !== 'string') return null;
  if (CERTIFICATE_ERRORS.has(code)) return 'untrusted';
  if (code === HOST_MISMATCH_ERROR) return 'host-mismatch';
  return null;
}
