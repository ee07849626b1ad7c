import { expect } from 'chai';
import { amqpReplyCode, brokerRefusal } from '../../src/amqp/broker-refusal.js';

const TARGET = { url: 'amqp://guest:guest@127.0.0.1:5672', queue: 'q', deadLetterQueue: 'q.dead' };

function isAmqpRefusal(error: unknown): boolean {
  return brokerRefusal(error, TARGET) !== null;
}

/** Shaped as amqplib raises a broker's channel or connection close: the reply code in `code`. */
function closeError(message: string, code: number): Error {
  return Object.assign(new Error(message), { code });
}

describe('amqpReplyCode: refusals by reply code, not by text', () => {
  it('reads the reply code amqplib puts on a channel close', () => {
    const error = closeError('Operation failed: QueueDeclare; 406 (PRECONDITION-FAILED) with message "inequivalent arg"', 406);
    expect(amqpReplyCode(error)).to.equal(406);
    expect(isAmqpRefusal(error)).to.equal(true);
  });

  it('refuses on 403 and 530 and waits on the codes of an outage', () => {
    expect(isAmqpRefusal(closeError('Channel closed by server: 403 (ACCESS-REFUSED)', 403))).to.equal(true);
    expect(isAmqpRefusal(closeError('Channel closed by server: 530 (NOT-ALLOWED)', 530))).to.equal(true);
    expect(isAmqpRefusal(closeError('Connection closed: 320 (CONNECTION-FORCED) with message "broker forced"', 320))).to.equal(false);
    expect(isAmqpRefusal(closeError('Connection closed: 541 (INTERNAL-ERROR)', 541))).to.equal(false);
    expect(isAmqpRefusal(closeError('Operation failed: BasicConsume; 404 (NOT-FOUND)', 404))).to.equal(false);
  });

  it("reads the code of a refused login from amqplib's handshake error, which has no code property", () => {
    const login = new Error(
      'Handshake terminated by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN."',
    );
    expect(amqpReplyCode(login)).to.equal(403);
    expect(isAmqpRefusal(login)).to.equal(true);
  });

  it('decides by the code, not by words in the text', () => {
    // A socket error whose text mentions a refusal is still an outage.
    const socket = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5672 (ACCESS_REFUSED? PRECONDITION_FAILED?)'), { code: 'ECONNREFUSED' });
    expect(amqpReplyCode(socket)).to.equal(null);
    expect(isAmqpRefusal(socket)).to.equal(false);
    // A forced close whose reason text says ACCESS_REFUSED is still a 320.
    expect(isAmqpRefusal(closeError('Connection closed: 320 (CONNECTION-FORCED) with message "ACCESS_REFUSED in a reason"', 320))).to.equal(false);
    expect(amqpReplyCode('a string')).to.equal(null);
    expect(isAmqpRefusal(new Error('Socket closed abruptly during opening handshake'))).to.equal(false);
  });
});
