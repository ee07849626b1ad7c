import { expect } from 'chai';
import { runHungShutdownScenario, SHUTDOWN_MARGIN_MS } from './hung-shutdown-scenario.js';

describe('shutdown while Redis hangs (integration: SIGSTOPped private redis-server, real RabbitMQ)', function () {
  this.timeout(300_000);

  it('exits within the grace period plus the margin, stops the threads before the channel, and loses nothing', async () => {
    const graceMs = 3_000;
    const outcome = await runHungShutdownScenario({ messages: 20_000, seed: 97, label: 'hung', graceMs });
    console.log(
      `      exit ${outcome.exitCode} after ${Math.round(outcome.exitMs)} ms; lost ${outcome.lostUnits}, overcount ${outcome.overcountUnits} (bound ${outcome.boundUnits})`,
    );
    // Spawned processes start and end with some latency of their own; the daemon's promise is grace + margin.
    expect(outcome.exitMs, `exited after ${Math.round(outcome.exitMs)} ms`).to.be.below(graceMs + SHUTDOWN_MARGIN_MS + 1_000);
    expect(outcome.exitCode, 'every close step bounded: the stop ends by itself, not by the backstop').to.equal(0);
    const order = (text: string) => outcome.firstLogs.findIndex((line) => line.includes(text));
    expect(order('grace period over'), 'the grace ran out on the hung batches').to.be.greaterThan(-1);
    expect(order('"msg":"worker threads stopped"'), 'the threads were stopped').to.be.greaterThan(-1);
    expect(order('"msg":"channel closed'), 'the channel closed as part of the stop').to.be.greaterThan(-1);
    expect(order('"msg":"worker threads stopped"'), 'threads stopped before the channel closed').to.be.below(order('"msg":"channel closed'));
    expect(
      outcome.firstLogs.some((line) => line.includes('left to redelivery')),
      'no lost-channel warning on a stop',
    ).to.equal(false);
    expect(outcome.lostUnits, 'nothing acked that was not written').to.equal(0);
    expect(outcome.overcountUnits, 'at most one batch per shard counted again').to.be.at.most(outcome.boundUnits);
    // The second daemon's stop is a clean one: no warning about deliveries left to redelivery.
    expect(outcome.secondLogs.some((line) => line.includes('left to redelivery') || line.includes('unacked deliveries; the broker redelivers'))).to.equal(
      false,
    );
  });
});
