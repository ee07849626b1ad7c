/**
 * The fault suite's closing table (report.ts): every scenario pushes a row
 * (lost, overcount, its bound, `tally deviation`'s estimate), and this
 * root-level hook prints them together and writes faults-report.md, the
 * figures docs/faults-and-deviation.md quotes. Named 0- so that mocha loads
 * it first; the hook runs after the last file.
 */
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { renderTable, rows } from './report.js';

// A root-level hook: runs once, after every scenario file.
after(async () => {
  if (rows.length === 0) return;
  const table = renderTable(rows);
  console.log(`\nfault suite report (overcount, bound and estimate in units; lost must be 0)\n\n${table}\n`);
  await writeFile(fileURLToPath(new URL('../faults-report.md', import.meta.url)), `${table}\n`);
});
