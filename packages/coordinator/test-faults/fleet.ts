/**
 * Every daemon process a scenario starts, and how each one ended. The suite
 * kills and stops daemons itself; any other exit (a crash, an exit on its
 * own, a non-zero code after SIGTERM) is recorded as a violation.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { queueState, spawnDaemon, waitForReadyEmpty, type DaemonProcess } from '../test/integration/harness.js';

type Ending = 'kill' | 'term';

export class DaemonFleet {
  readonly violations: string[] = [];
  /** Every daemon started, in order, with its logs. */
  readonly daemons: DaemonProcess[] = [];
  private readonly live = new Set<DaemonProcess>();
  private readonly intended = new WeakMap<DaemonProcess, Ending>();
  started = 0;
  kills = 0;

  /**
   * Starts a daemon and waits until it consumes; an exit we did not ask for becomes a violation. `selfKill`: a
   * daemon that SIGKILLs itself (TALLY_FAULT_KILL_AFTER_WRITE), counted as one of our kills.
   */
  async start(env: Record<string, string>, { selfKill = false } = {}): Promise<DaemonProcess> {
    const daemon = spawnDaemon(env);
    this.started++;
    this.daemons.push(daemon);
    this.live.add(daemon);
    if (selfKill) {
      this.intended.set(daemon, 'kill');
      this.kills++;
    }
    void daemon.exited.then(({ code, signal }) => {
      this.live.delete(daemon);
      const intent = this.intended.get(daemon);
      const tail = `stderr: ${daemon.stderr.join('').slice(-300)}; last log: ${daemon.logs.at(-1) ?? ''}`;
      if (intent === undefined) this.violations.push(`daemon ${daemon.child.pid} exited on its own (code ${code}, signal ${signal}); ${tail}`);
      else if (intent === 'term' && code !== 0)
        this.violations.push(`daemon ${daemon.child.pid} exited with code ${code} (signal ${signal}) after SIGTERM; ${tail}`);
      else if (intent === 'kill' && signal !== 'SIGKILL')
        this.violations.push(`daemon ${daemon.child.pid} ended with code ${code} before our SIGKILL landed; ${tail}`);
    });
    await daemon.waitForLog('"msg":"consuming"', 60_000);
    return daemon;
  }

  /** The log lines of every daemon started so far. */
  get logs(): string[] {
    return this.daemons.flatMap((daemon) => daemon.logs);
  }

  /** The last warnings and errors the daemons logged (pino levels 40 and up), for a failure that must name its cause. */
  lastWarnings(count = 12): string {
    const lines = this.logs.filter((line) => /"level":(4|5|6)\d/.test(line)).slice(-count);
    return lines.length === 0 ? 'no warning or error logged' : lines.map((line) => line.slice(0, 600)).join('\n');
  }

  /** SIGKILL: no cleanup, no final ack, no counter flush. */
  async kill(daemon: DaemonProcess): Promise<void> {
    this.intended.set(daemon, 'kill');
    this.kills++;
    daemon.child.kill('SIGKILL');
    await daemon.exited;
  }

  /** SIGTERM and wait: the daemon must finish what is in flight and exit 0. */
  async stop(daemon: DaemonProcess, timeoutMs = 60_000): Promise<void> {
    this.intended.set(daemon, 'term');
    daemon.child.kill('SIGTERM');
    const timer = setTimeout(() => daemon.child.kill('SIGKILL'), timeoutMs);
    try {
      await daemon.exited;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Runs a daemon until nothing is ready, stops it, and repeats if anything came back. */
  async drain(env: Record<string, string>, queue: string): Promise<void> {
    for (let round = 0; round < 5; round++) {
      const daemon = await this.start(env);
      await waitForReadyEmpty(queue, 240_000);
      await sleep(300);
      await this.stop(daemon);
      if ((await queueState(queue)).messageCount === 0) return;
    }
    throw new Error(`queue ${queue} did not drain`);
  }

  /** For `finally`: kills whatever is still running, without counting it as a violation. */
  async killAll(): Promise<void> {
    for (const daemon of [...this.live]) {
      this.intended.set(daemon, 'kill');
      daemon.child.kill('SIGKILL');
      await daemon.exited;
    }
  }
}
