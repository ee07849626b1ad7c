export { generateWorkload, skuName, WORKLOAD_DEFAULTS, type Publish, type PublishKind, type Workload, type WorkloadOptions } from './workload.js';
export { publishAll, ensureQueue, publishTarget, routingKeyOf, type PublishOptions, type PublishTarget } from './publisher.js';
export { badSample, type BadSample } from './bad-corpus.js';
export { seededRandom, randomInt, zipfPicker } from './random.js';
export { compareWithTruth, describeTruthCheck, type TruthCheck } from './truth.js';
