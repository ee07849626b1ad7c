import { expect } from 'chai';
import { brokerRefusal, brokerTlsRefusal, classifyBrokerRefusal, permissionFix } from '../../src/amqp/broker-refusal.js';

/** Shaped as amqplib raises a channel the broker closed: the reply code in `code`. */
function closed(message: string, code: number): Error {
  return Object.assign(new Error(message), { code });
}

const TARGET = { url: 'amqp://tally:secret@rabbit:5672/inventory', queue: 'stock.moves', deadLetterQueue: 'stock.moves.dead' };

describe('brokerRefusal (RabbitMQ refusals at start -> one line naming the fix)', () => {
  it('a wrong login names TALLY_AMQP_URL and never the password', () => {
    const line = brokerRefusal(
      new Error(
        'Handshake terminated by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."',
      ),
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
      closed(
        `Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - access to queue 'stock.moves' in vhost 'inventory' refused for user 'tally'"`,
        403,
      ),
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
      closed(
        `Channel closed by server: 406 (PRECONDITION-FAILED) with message "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'stock.moves' in vhost 'inventory': received 'quorum' but current is 'classic'"`,
        406,
      ),
      TARGET,
    )!;
    expect(line).to.include("inequivalent arg 'x-queue-type'").and.include('TALLY_QUEUE').and.include('other arguments');
  });

  it('a broker without the consistent-hash plugin (503 on the connection) names the plugin to enable', () => {
    const line = brokerRefusal(
      closed(`Connection closed: 503 (COMMAND-INVALID) with message "COMMAND_INVALID - unknown exchange type 'x-consistent-hash'"`, 503),
      TARGET,
    )!;
    expect(line).to.include('TALLY_PARTITIONS').and.include('rabbitmq-plugins enable rabbitmq_consistent_hash_exchange');
  });

  it('an exclusive queue of another connection (405) names TALLY_QUEUE', () => {
    const line = brokerRefusal(
      closed(
        `Channel closed by server: 405 (RESOURCE-LOCKED) with message "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'stock.moves' in vhost 'inventory'"`,
        405,
      ),
      TARGET,
    )!;
    expect(line).to.include('TALLY_QUEUE').and.include('exclusive');
  });

  for (const transient of [
    'connect ECONNREFUSED 127.0.0.1:5672',
    'Socket closed abruptly during opening handshake',
    'read ECONNRESET',
    'Connection closed: 320 (CONNECTION-FORCED) with message "CONNECTION_FORCED - broker forced connection closure with reason \'shutdown\'"',
  ]) {
    it(`passes by itself, so retried: ${transient}`, () => {
      expect(brokerRefusal(new Error(transient), TARGET)).to.equal(null);
    });
  }

  it('every line is one line', () => {
    const line = brokerRefusal(closed('Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED -\naccess"', 403), TARGET)!;
    expect(line).not.to.match(/[\r\n]/);
  });

  describe('TLS: a certificate the client refuses is configuration, named with its fix', () => {
    /** Shaped as Node's TLS socket fails the handshake, which amqplib passes on as it is. */
    const tlsError = (message: string, code: string): Error => Object.assign(new Error(message), { code });

    for (const code of ['SELF_SIGNED_CERT_IN_CHAIN', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'CERT_HAS_EXPIRED']) {
      it(`${code} names the problem and NODE_EXTRA_CA_CERTS, with code TALLY_AMQP_TLS`, () => {
        const refusal = classifyBrokerRefusal(tlsError('self-signed certificate in certificate chain', code), TARGET)!;
        expect(refusal.code).to.equal('TALLY_AMQP_TLS');
        expect(refusal.line).to.include(code).and.include('NODE_EXTRA_CA_CERTS').and.include('not trusted');
      });
    }

    it('a certificate for another host names TALLY_AMQP_URL', () => {
      const line = brokerTlsRefusal(
        tlsError("Hostname/IP does not match certificate's altnames: IP: 10.0.0.9 is not in the cert's list: 127.0.0.1", 'ERR_TLS_CERT_ALTNAME_INVALID'),
      )!;
      expect(line).to.include('TALLY_AMQP_URL').and.include('does not name the host');
    });

    it('amqps:// aimed at a plaintext port says the port does not speak TLS', () => {
      const line = brokerTlsRefusal(
        tlsError('800CD00C5C7F0000:error:0A00010B:SSL routines:ssl3_get_record:wrong version number:ssl3_record.c:350:\n', 'ERR_SSL_WRONG_VERSION_NUMBER'),
      )!;
      expect(line).to.include('does not speak TLS').and.include('amqps://');
      expect(line).not.to.match(/[\r\n]/);
    });

    it('an AMQP refusal keeps its own code; a dropped socket is neither', () => {
      expect(classifyBrokerRefusal(closed('Channel closed by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - x"', 403), TARGET)?.code).to.equal(
        'TALLY_AMQP_REFUSED',
      );
      expect(classifyBrokerRefusal(tlsError('read ECONNRESET', 'ECONNRESET'), TARGET)).to.equal(null);
      expect(classifyBrokerRefusal(tlsError('connect ECONNREFUSED 127.0.0.1:5671', 'ECONNREFUSED'), TARGET)).to.equal(null);
    });
  });
});
