import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { generateWorkload, publishAll } from '@tally/workload';
import { freePort } from '@tally/testkit';
import { cleanup, startDaemon, stopDaemon, testSpace, waitForReadyEmpty, AMQP_URL, CLI } from './harness.js';
import { DEPLOY, runTool, startPrometheus, type PrometheusServer } from './ops-tools.js';

interface GrafanaPanel {
  readonly title: string;
  readonly type: string;
  readonly targets?: ReadonlyArray<{ readonly expr?: string }>;
  readonly panels?: readonly GrafanaPanel[];
}

/** Every panel's PromQL, rows' nested panels included. */
function panelExpressions(panels: readonly GrafanaPanel[]): Array<{ title: string; expr: string }> {
  return panels.flatMap((panel) => [
    ...(panel.targets ?? []).filter((t) => t.expr).map((t) => ({ title: panel.title, expr: t.expr! })),
    ...panelExpressions(panel.panels ?? []),
  ]);
}

/** What Grafana substitutes before it sends a query: the dashboard's variables and the rate interval. */
function substitute(expr: string, variables: Record<string, string>): string {
  return expr.replace(/\$(__rate_interval|__interval|__range|\w+)|\$\{(\w+)(?::\w+)?\}/g, (whole, plain?: string, braced?: string) => {
    const name = plain ?? braced!;
    if (name === '__rate_interval' || name === '__interval') return '1m';
    if (name === '__range') return '1h';
    if (!(name in variables)) throw new Error(`dashboard variable ${whole} has no test value`);
    return variables[name]!;
  });
}

async function waitFor(prometheus: PrometheusServer, expr: string, accept: (value: number) => boolean, timeoutMs = 60_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let last: number | undefined;
  for (;;) {
    const result = await prometheus.query(expr);
    last = result.length > 0 ? Number(result[0]!.value[1]) : undefined;
    if (last !== undefined && accept(last)) return last;
    if (Date.now() > deadline) throw new Error(`${expr} never became acceptable; last ${last}`);
    await sleep(500);
  }
}

describe('a real Prometheus scrapes the daemon (integration: Debian prometheus, HTTP API, rules, Grafana panels)', function () {
  this.timeout(240_000);

  it("the values Prometheus holds match tally stats; every rule evaluates; every dashboard panel's expression evaluates", async () => {
    const port = await freePort();
    const space = testSpace('prom', { TALLY_METRICS_PORT: String(port), TALLY_BATCH_WAIT_MS: '10', TALLY_PREFETCH: '100', TALLY_MAX_MESSAGE_BYTES: '4096' });
    let prometheus: PrometheusServer | undefined;
    try {
      const daemon = await startDaemon(space.env);
      prometheus = await startPrometheus([`127.0.0.1:${port}`], { ruleFiles: [join(DEPLOY, 'prometheus', 'tally.rules.yml')] });
      // Scraped before the traffic, so rates see the counters move.
      await waitFor(prometheus, `up{job="tally"}`, (v) => v === 1);
      await waitFor(prometheus, `tally_received_total{job="tally"}`, (v) => v === 0);
      const workload = generateWorkload({ messages: 3_000, skus: 300, seed: 31, duplicateRate: 0.05, badRate: 0.02, idPrefix: space.queue, maxBytes: 4096 });
      await publishAll(workload.publishes, { url: AMQP_URL, queue: space.queue });
      await waitForReadyEmpty(space.queue);

      const selector = `{job="tally",messaging_destination_name="${space.queue}"}`;
      const published = workload.publishes.length;
      await waitFor(prometheus, `tally_received_total${selector}`, (v) => v === published);
      // Let the stats flush reach Redis and one more scrape land after the last change.
      await sleep(2_500);
      const run = await runTool(process.execPath, [CLI, 'stats', '--json'], { env: { ...process.env, ...space.env } });
      expect(run.code, run.stderr).to.equal(0);
      const stats = JSON.parse(run.stdout) as Record<string, number>;
      expect(stats.received).to.equal(published);
      for (const name of [
        'received',
        'counted',
        'duplicates',
        'partial_duplicates',
        'dead_lettered',
        'occupation_failures',
        'redelivered_unmarked',
        'empty',
        'write_retries',
        'count_errors',
      ]) {
        const value = await waitFor(prometheus, `tally_${name}_total${selector}`, (v) => v === stats[name], 10_000).catch((error: Error) => error);
        expect(value, `tally_${name}_total vs tally stats ${name}`).to.equal(stats[name]);
      }
      for (const name of ['loaded', 'window_message', 'occupied_unacked_message']) {
        const [sample] = await prometheus.query(`tally_${name}_seconds_total${selector}`);
        expect(Math.abs(Number(sample!.value[1]) * 1000 - stats[`${name}_ms`]!), `${name}: seconds in Prometheus, milliseconds in tally stats`).to.be.below(1);
      }
      expect(stats.counted).to.equal(workload.good);
      expect(stats.dead_lettered).to.equal(workload.bad);
      const [consumed] = await prometheus.query(`messaging_client_consumed_messages_total${selector}`);
      expect(Number(consumed!.value[1])).to.equal(published);
      const [target] = await prometheus.query('target_info{job="tally"}');
      expect(target!.metric.service_name).to.equal('tally');
      await waitFor(prometheus, `tally_connection_up{job="tally",server_type="redis"}`, (v) => v === 1);

      // Rules: each one evaluated by the real server, without error.
      await waitFor(prometheus, `tally:settled_messages:rate5m${selector}`, (v) => v > 0, 90_000);
      const rules = (await (await fetch(`${prometheus.url}/api/v1/rules`)).json()) as {
        data: { groups: Array<{ rules: Array<{ name: string; health: string; lastError?: string }> }> };
      };
      const all = rules.data.groups.flatMap((g) => g.rules);
      expect(all.length).to.be.at.least(13);
      for (const rule of all) expect(rule.health, `${rule.name}: ${rule.lastError ?? ''}`).to.equal('ok');
      const firing = (await prometheus.query('ALERTS{alertname="TallyDeadLetters"}')).map((s) => s.metric.messaging_destination_name);
      expect(firing, 'dead letters arrived: the alert is pending or firing').to.include(space.queue);

      // The dashboard: every panel's expression runs against this Prometheus.
      const dashboard = JSON.parse(await readFile(join(DEPLOY, 'grafana', 'tally.json'), 'utf8')) as {
        panels: GrafanaPanel[];
        templating: { list: Array<{ name: string }> };
      };
      const variables = { job: 'tally', instance: '.+', queue: space.queue, datasource: 'prometheus' };
      for (const variable of dashboard.templating.list) expect(variables, `test value for $${variable.name}`).to.have.property(variable.name);
      const expressions = panelExpressions(dashboard.panels);
      const titles = new Set(expressions.map((e) => e.title));
      for (const title of [
        'Throughput',
        'Duplicates',
        'Dead letters',
        'Crash window',
        'Oldest unacked delivery',
        'Batch latency',
        'End-to-end latency',
        'Redis and RabbitMQ up',
      ]) {
        expect(titles, `a panel "${title}"`).to.include(title);
      }
      const empty: string[] = [];
      for (const { title, expr } of expressions) {
        const result = await prometheus.query(substitute(expr, variables));
        if (result.length === 0) empty.push(`${title}: ${expr}`);
      }
      // Every panel has data here except what needs a fault or RabbitMQ's own exporter.
      const mayBeEmpty = /occupation_failures|recount_ceiling|messages_at_risk/;
      expect(
        empty.filter((e) => !mayBeEmpty.test(e)),
        'panels with no data',
      ).to.deep.equal([]);
      expect((await stopDaemon(daemon)).code).to.equal(0);
    } finally {
      await prometheus?.close();
      await cleanup(space);
    }
  });
});
