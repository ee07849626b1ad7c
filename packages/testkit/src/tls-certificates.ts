/**
 * Certificates for TLS tests, made with the installed openssl in a
 * temporary directory: a CA, a server certificate it signs for 127.0.0.1 and
 * localhost (usable as a client certificate too: a Redis Cluster node
 * presents it on the cluster bus and to its master), and an unrelated
 * second CA whose trust must not be enough. EC P-256, so it takes tens of
 * milliseconds.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { RedisTlsFiles } from './redis-process.js';

const run = promisify(execFile);

export interface TestCertificates {
  readonly dir: string;
  readonly caFile: string;
  readonly wrongCaFile: string;
  readonly certFile: string;
  readonly keyFile: string;
  /** The files a TLS-only redis-server needs, and the CA for the test's own clients. */
  readonly redis: RedisTlsFiles;
  /** Removes the directory. */
  remove(): Promise<void>;
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  await run('openssl', args, { cwd: dir, timeout: 60_000 });
}

export async function makeTestCertificates(): Promise<TestCertificates> {
  const dir = await mkdtemp(join(tmpdir(), 'tally-test-tls-'));
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  await openssl(dir, 'req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=Tally test CA');
  await openssl(dir, 'req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=localhost');
  await writeFile(
    join(dir, 'server.ext'),
    'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n',
  );
  await openssl(
    dir,
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.pem',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'server.pem',
    '-days',
    '2',
    '-extfile',
    'server.ext',
  );
  await openssl(dir, 'req', '-x509', ...ec, '-keyout', 'wrong-ca.key', '-out', 'wrong-ca.pem', '-days', '2', '-subj', '/CN=Some other CA');
  const caFile = join(dir, 'ca.pem');
  const certFile = join(dir, 'server.pem');
  const keyFile = join(dir, 'server.key');
  return {
    dir,
    caFile,
    wrongCaFile: join(dir, 'wrong-ca.pem'),
    certFile,
    keyFile,
    redis: { certFile, keyFile, caFile, ca: await readFile(caFile) },
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}
