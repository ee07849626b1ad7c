/** Pure parser for the reply of CLUSTER NODES. */

export interface ClusterNodeLine {
  readonly id: string;
  readonly port: number;
  readonly role: 'master' | 'replica';
  /** The master's node id, for a replica; null for a master. */
  readonly masterId: string | null;
  /** Flagged `fail` (not just `fail?`): the cluster agrees it is down. */
  readonly failed: boolean;
  readonly myself: boolean;
  readonly connected: boolean;
  /** Slot ranges as written (`0-5460`), masters only. */
  readonly slots: readonly string[];
}

/**
 * One line per node: `<id> <ip:port@cport[,hostname]> <flags> <master|-> <ping> <pong> <epoch> <link> <slot>...`
 * (https://redis.io/commands/cluster-nodes/). Importing and migrating slot
 * markers (`[...]`) are skipped.
 */
export function parseClusterNodes(text: string): ClusterNodeLine[] {
  const nodes: ClusterNodeLine[] = [];
  for (const line of text.split(/\r?\n/)) {
    const fields = line.trim().split(' ');
    if (fields.length < 8) continue;
    const [id, address, flagText, master, , , , link, ...slots] = fields as [string, string, string, string, string, string, string, string, ...string[]];
    const port = Number(/:(\d+)@/.exec(address)?.[1] ?? NaN);
    const flags = new Set(flagText.split(','));
    if (flags.has('noaddr') || !Number.isInteger(port)) continue;
    nodes.push({
      id,
      port,
      role: flags.has('master') ? 'master' : 'replica',
      masterId: master === '-' ? null : master,
      failed: flags.has('fail'),
      myself: flags.has('myself'),
      connected: link === 'connected',
      slots: slots.filter((s) => !s.startsWith('[')),
    });
  }
  return nodes;
}
