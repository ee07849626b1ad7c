/**
 * A message shape of the user's own, as an existing inventory service
 * publishes it, and the TALLY_MESSAGE_MAPPING that reads it: what
 * `tally publish --shape foreign`, the tests and the demo drive, so that
 * they all go through the same mapped path.
 *
 *   {"eventId": "e-81", "warehouse": "WH3", "lines": [{"product": {"sku": "A-1"}, "qty": -2, "reason": "sale"}]}
 *
 * or the same without `eventId`, the id in the `x-event-id` header. Each
 * change counts under `<warehouse>:<sku>` (`WH3:A-1`).
 */

export const FOREIGN_ID_HEADER = 'x-event-id';
export const FOREIGN_SKU_SEPARATOR = ':';
export const WAREHOUSES: readonly string[] = Object.freeze(['WH1', 'WH2', 'WH3', 'WH4']);

/** The declaration, as an operator writes it into TALLY_MESSAGE_MAPPING (JSON.stringify it). */
export const FOREIGN_SHAPE_MAPPING = Object.freeze({
  id: ['/eventId', `header:${FOREIGN_ID_HEADER}`],
  changes: '/lines',
  sku: ['/warehouse', '0/product/sku'],
  skuSeparator: FOREIGN_SKU_SEPARATOR,
  delta: '0/qty',
  type: '0/reason',
});

/** The SKU Tally counts a foreign change under. */
export function foreignSku(warehouse: string, sku: string): string {
  return `${warehouse}${FOREIGN_SKU_SEPARATOR}${sku}`;
}

/** A foreign body; `id` null leaves `eventId` out (the id travels in the header). */
export function foreignBody(id: string | null, warehouse: string, changes: ReadonlyArray<{ sku: string; delta: number; type?: string }>): Buffer {
  const lines = changes.map(({ sku, delta, type }) => (type === undefined ? { product: { sku }, qty: delta } : { product: { sku }, qty: delta, reason: type }));
  return Buffer.from(JSON.stringify(id === null ? { warehouse, lines } : { eventId: id, warehouse, lines }));
}
