/**
 * Which partitions this daemon consumes (TALLY_PARTITIONS > 1), decided at
 * every heartbeat from the live heartbeats alone: the daemons of the same
 * queue and partition count that are not stopping, sorted, through the pure
 * assignPartitions (shared/partitions.ts). Every daemon computes the same
 * map from the same set, so nothing is negotiated and no lock is taken;
 * single active consumer is what keeps two daemons from consuming one
 * partition while their views differ for a beat.
 *
 * Timing: a daemon that stops says so in its last beats (`leaving`), so the
 * others take its partitions at their next beat; one that dies is listed
 * until its key expires (HEARTBEAT_TTL_BEATS intervals), then its partitions
 * move at the next beat: at most TTL + one interval, 4 intervals.
 */
import type { Redis } from 'ioredis';
import { partitionsOf } from '@tally/shared';
import { listDaemons, type LiveDaemon } from './heartbeat.js';
import type { Logger } from '../process/logger.js';

export interface PartitionBalancerOptions {
  readonly prefix: string;
  readonly queue: string;
  readonly partitions: number;
  readonly selfId: string;
}

/** The daemons that share out the partitions: same queue, same partition count, not stopping. */
export function partitionPeers(daemons: readonly LiveDaemon[], options: Pick<PartitionBalancerOptions, 'queue' | 'partitions'>): string[] {
  return daemons
    .filter((d) => d.queue === options.queue && d.partitions_total === options.partitions && !d.leaving)
    .map((d) => d.id)
    .sort();
}

/** What the balancer reads and whom it tells. */
export interface PartitionBalancerDeps {
  /** The nodes to scan for heartbeats (every master on a cluster). */
  nodes(): readonly Redis[];
  /** The partitions this daemon owns now (the message source subscribes to them). */
  assign(partitions: readonly number[]): void;
  /** True once the daemon is stopping: it keeps nothing new. */
  leaving(): boolean;
  readonly log: Logger;
}

export class PartitionBalancer {
  private current: string | null = null;

  constructor(
    private readonly options: PartitionBalancerOptions,
    private readonly deps: PartitionBalancerDeps,
  ) {}

  async rebalance(): Promise<void> {
    if (this.deps.leaving()) return;
    const daemons = await listDaemons(this.deps.nodes(), this.options.prefix);
    const peers = partitionPeers(daemons, this.options);
    const mine = partitionsOf(this.options.partitions, peers, this.options.selfId);
    const key = mine.join(',');
    if (key !== this.current) {
      this.deps.log.info({ partitions: mine, daemons: new Set([...peers, this.options.selfId]).size, of: this.options.partitions }, 'partitions assigned');
      this.current = key;
    }
    // Every beat, not only on a change: a subscription that failed (a channel error) is retried here.
    this.deps.assign(mine);
  }
}
