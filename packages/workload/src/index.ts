/**
 * @tally/workload: seeded test loads with their ground truth, and their publishing (tally publish, the tests,
 * the bench).
 */
export {
  generateWorkload,
  MESSAGE_SHAPES,
  skuName,
  WORKLOAD_DEFAULTS,
  type MessageShape,
  type Publish,
  type PublishKind,
  type Workload,
  type WorkloadOptions,
} from './workload.js';
export { FOREIGN_ID_HEADER, FOREIGN_SHAPE_MAPPING, foreignBody, foreignSku, WAREHOUSES } from './foreign-shape.js';
export { publishAll, ensureQueue, publishTarget, routingKeyOf, type PublishOptions, type PublishTarget } from './publisher.js';
export { badSample, foreignBadSample, type BadSample } from './bad-corpus.js';
export { seededRandom, randomInt, zipfPicker } from './random.js';
export { compareWithTruth, describeTruthCheck, type TruthCheck } from './truth.js';
