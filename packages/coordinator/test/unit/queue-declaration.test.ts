import { expect } from 'chai';
import { parseArgumentRefusal, workQueueArguments, deadQueueArguments } from '../../src/amqp/queue-declaration.js';

describe('queue declaration', () => {
  const options = { queue: 'q', deadLetterQueue: 'q.dead', deliveryLimit: 7 } as const;

  it('declares classic queues without arguments, as Tally always did, and quorum ones with a delivery limit and at-least-once dead-lettering', () => {
    expect(workQueueArguments({ ...options, queueType: 'classic' })).to.deep.equal({});
    expect(deadQueueArguments({ ...options, queueType: 'classic' })).to.deep.equal({});
    expect(workQueueArguments({ ...options, queueType: 'quorum' })).to.deep.equal({
      'x-queue-type': 'quorum',
      'x-delivery-limit': 7,
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': 'q.dead',
      'x-dead-letter-strategy': 'at-least-once',
      'x-overflow': 'reject-publish',
    });
    expect(deadQueueArguments({ ...options, queueType: 'quorum' })).to.deep.equal({ 'x-queue-type': 'quorum' });
  });

  it("reads the broker's refusals (texts as RabbitMQ 3.10 writes them)", () => {
    expect(
      parseArgumentRefusal(
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none",
      ),
    ).to.deep.equal({ argument: 'x-queue-type', current: undefined });
    expect(
      parseArgumentRefusal(
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q' in vhost '/': received none but current is the value '' of type 'longstr'",
      ),
    ).to.deep.equal({ argument: 'x-dead-letter-exchange', current: '' });
    expect(
      parseArgumentRefusal(
        "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received none but current is the value '5' of type 'signedint'",
      ),
    ).to.deep.equal({ argument: 'x-delivery-limit', current: 5 });
    expect(
      parseArgumentRefusal(
        "PRECONDITION_FAILED - inequivalent arg 'x-thing' for queue 'q' in vhost '/': received none but current is the value 'x' of type 'table'",
      )?.current,
    ).to.equal(null);
    expect(
      parseArgumentRefusal("PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received '9' but current is '5'"),
    ).to.deep.equal({ argument: 'x-delivery-limit', current: '5', typeAsSent: true });
    expect(
      parseArgumentRefusal("PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"),
    ).to.equal(null);
  });
});
