/** The suite's closing table: one row per scenario, printed after the last one. */
export interface ScenarioRow {
  readonly scenario: string;
  /** Messages published: good, duplicate publishes and bad. */
  readonly messages: number;
  readonly kills: number;
  /** Units below the truth (must be 0). */
  readonly lost: number;
  /** Units above the truth. */
  readonly overcount: number;
  /** The bound on the overcount, in units. */
  readonly bound: number;
  /** The estimator's expected overcount for the run, in units (messages × mean units per message). */
  readonly estimate: number;
  readonly note: string;
}

export const rows: ScenarioRow[] = [];

export function renderTable(list: readonly ScenarioRow[]): string {
  const header = ['scenario', 'messages', 'kills', 'lost', 'overcount', 'bound', 'estimate', 'note'];
  const lines = [`| ${header.join(' | ')} |`, `|${header.map((h, i) => (i >= 1 && i <= 6 ? '---:' : '---')).join('|')}|`];
  for (const row of list) {
    lines.push(
      `| ${row.scenario} | ${row.messages} | ${row.kills} | ${row.lost} | ${row.overcount} | ${row.bound} | ${Math.round(row.estimate)} | ${row.note} |`,
    );
  }
  return lines.join('\n');
}
