import { expect } from 'chai';
import { brokerRefusal, permissionFix } from '../../src/broker-refusal.js';

const TARGET = { url: 'amqp://tally:secret@rabbit:5672/inventory', queue: 'stock.moves', deadLetterQueue: 'stock.moves.dead' };

describe('brokerRefusal (RabbitMQ refusals at start -> one line naming the fix)', () => {
  it('a wrong login names TALLY_AMQP_URL and never the password', () => {
    const line = brokerRefusal(
      new Error('Handshake terminated by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."'),
      TARGET,
    )!;
    expect(line).to.include('TALLY_AMQP_URL').and.include('Login was refused');
    expect(line).not.to.include('secret');
  });

  it('a vhost the user may not open (amqplib keeps only "got <ConnectionClose>") names the vhost, the user and set_permissions', () => {
    const line = brokerRefusal(new Error('Expected ConnectionOpenOk; got <ConnectionClose channel:0>'), TARGET)!;
    expect(line).to.include("vhost 'inventory'").and.include("user 'tally'").and.include('rabbitmqctl set_permissions');
  });

  it('a queue the user may not declare or consume names the queue and the exact permissions', () => {
    const line = brokerRefusal(
      new Error(`Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - access to queue 'stock.moves' in vhost 'inventory' refused for user 'tally'"`),
      TARGET,
    )!;
    expect(line).to.include("access to queue 'stock.moves'").and.include(permissionFix(TARGET));
    expect(permissionFix(TARGET)).to.equal(
      "rabbitmqctl set_permissions -p 'inventory' 'tally' '^stock\\.moves(\\.dead)?$' '^(amq\\.default|stock\\.moves\\.dead)$' '^stock\\.moves(\\.dead)?$'",
    );
  });

  it('the default vhost is /', () => {
    expect(permissionFix({ ...TARGET, url: 'amqp://guest:guest@127.0.0.1:5672' })).to.include("-p '/' 'guest'");
  });

  it('a queue declared with other arguments (406) says so and names TALLY_QUEUE', () => {
    const line = brokerRefusal(
      new Error(`Channel closed by server: 406 (PRECONDITION-FAILED) with message "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'stock.moves' in vhost 'inventory': received 'quorum' but current is 'classic'"`),
      TARGET,
    )!;
    expect(line).to.include("inequivalent arg 'x-queue-type'").and.include('TALLY_QUEUE').and.include('other arguments');
  });

  it('an exclusive queue of another connection (405) names TALLY_QUEUE', () => {
    const line = brokerRefusal(new Error(`Channel closed by server: 405 (RESOURCE-LOCKED) with message "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'stock.moves' in vhost 'inventory'"`), TARGET)!;
    expect(line).to.include('TALLY_QUEUE').and.include('exclusive');
  });

  for (const transient of ['connect ECONNREFUSED 127.0.0.1:5672', 'Socket closed abruptly during opening handshake', 'read ECONNRESET', 'Connection closed: 320 (CONNECTION-FORCED) with message "CONNECTION_FORCED - broker forced connection closure with reason \'shutdown\'"']) {
    it(`passes by itself, so retried: ${transient}`, () => {
      expect(brokerRefusal(new Error(transient), TARGET)).to.equal(null);
    });
  }

  it('every line is one line', () => {
    const line = brokerRefusal(new Error('Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED -\naccess"'), TARGET)!;
    expect(line).not.to.match(/[\r\n]/);
  });
});
