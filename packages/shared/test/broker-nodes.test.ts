import { expect } from 'chai';
import { nextNodeIndex, splitAmqpUrls, validateAmqpNodes } from '../src/broker-nodes.js';
import { ConfigError } from '../src/errors.js';

const lower = (url: string): string => url.replace(/^[A-Za-z][A-Za-z0-9+.-]*:/, (scheme) => scheme.toLowerCase());

describe('broker nodes (TALLY_AMQP_URL lists)', () => {
  describe('splitAmqpUrls', () => {
    it('splits on a comma that starts another amqp:// or amqps:// URL, in any case, blanks trimmed', () => {
      expect(splitAmqpUrls('amqp://h1:5672, AMQP://h2:5672 ,amqps://h3')).to.deep.equal(['amqp://h1:5672', 'AMQP://h2:5672', 'amqps://h3']);
    });
    it('keeps a comma inside a password, even one followed by "amqp"', () => {
      expect(splitAmqpUrls('amqp://u:a,b@h1,amqp://u:a,b@h2')).to.deep.equal(['amqp://u:a,b@h1', 'amqp://u:a,b@h2']);
      expect(splitAmqpUrls('amqp://u:x,amqp@h1')).to.deep.equal(['amqp://u:x,amqp@h1']);
    });
    it('drops trailing commas and blank input', () => {
      expect(splitAmqpUrls('amqp://h1, ,')).to.deep.equal(['amqp://h1']);
      expect(splitAmqpUrls('  ')).to.deep.equal([]);
    });
  });

  describe('validateAmqpNodes', () => {
    it('returns every node in the order given, schemes lowered by the caller’s function', () => {
      expect(validateAmqpNodes('V', 'AMQP://u:p@b:1/v,amqp://u:p@a:2/v', lower)).to.deep.equal(['amqp://u:p@b:1/v', 'amqp://u:p@a:2/v']);
    });
    it('names the variable and the node by its position', () => {
      try {
        validateAmqpNodes('TALLY_AMQP_URL', 'amqp://h1,amqp://h2,amqps://h3', lower);
        expect.fail('expected a ConfigError');
      } catch (error) {
        expect(error).to.be.instanceOf(ConfigError);
        expect((error as ConfigError).variable).to.equal('TALLY_AMQP_URL');
        expect((error as ConfigError).message).to.match(/node 3 of 3/);
      }
    });
  });

  describe('nextNodeIndex', () => {
    it('moves to the next node and wraps around, so a lost node is left for the others', () => {
      const seen: number[] = [];
      let index = 0;
      for (let i = 0; i < 7; i++) {
        index = nextNodeIndex(index, 3);
        seen.push(index);
      }
      expect(seen).to.deep.equal([1, 2, 0, 1, 2, 0, 1]);
    });
    it('stays on the one node of a single-URL list', () => {
      expect(nextNodeIndex(0, 1)).to.equal(0);
    });
    it('refuses an empty list (a bug of the caller, not an outage)', () => {
      expect(() => nextNodeIndex(0, 0)).to.throw(RangeError);
    });
  });
});
