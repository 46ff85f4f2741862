// Walks through one idempotency record against a running sidecar.
//
// Usage: node walkthrough.js HOST:PORT
//
// Begin with a fresh key (ACQUIRED), Complete with a JSON snapshot, Begin again
// (COMPLETED, the same bytes replayed), Begin with another request hash
// (MISMATCH, no result). Exits 0 only if every answer is the one
// docs/spec.md#transitions prescribes; 1 otherwise; 2 on bad usage.
'use strict';

const crypto = require('node:crypto');
const {connect, idempotent} = require('./idempotency');

// SHA-256 of the request in canonical JSON (sorted keys, no spaces).
function requestHash(request) {
  const canonical = JSON.stringify(
      Object.fromEntries(Object.entries(request).sort(([a], [b]) => (a < b ? -1 : 1))));
  return crypto.createHash('sha256').update(canonical, 'utf8').digest();
}

function check(ok, what) {
  console.log(`${ok ? '  ok    ' : '  FAIL  '}${what}`);
  if (!ok) process.exit(1);
}

function mustNotRun() {
  check(false, 'the write ran although the record was not acquired');
}

async function main(address) {
  const sidecar = connect(address);
  const key = {tenant: 'examples', operation: 'create-payment',
               key: `node-${crypto.randomUUID()}`};
  const request = {amount_minor: 1250, currency: 'EUR', payee: 'Zürich Café AG'};
  console.log(`sidecar ${address}, record ${key.tenant}/${key.operation}/${key.key}`);

  // The response we will store; non-ASCII on purpose, replays must be byte-exact.
  const paymentId = `pay_${crypto.randomBytes(6).toString('hex')}`;
  const body = Buffer.from(JSON.stringify({payment_id: paymentId, ...request}), 'utf8');
  const headers = {location: `/payments/${paymentId}`};

  console.log('1. Begin with a fresh key');
  const first = await idempotent(sidecar, {key, requestHash: requestHash(request)},
      async ({fencingToken}) => {
        check(fencingToken === '1', `acquired with fencing token ${fencingToken}, want 1`);
        console.log(`2. write payment ${paymentId} (token ${fencingToken}), then Complete`);
        return {code: 201, body, content_type: 'application/json', headers};
      });
  check(first.outcome === 'OUTCOME_ACQUIRED', `outcome ${first.outcome}`);
  check(first.record.status === 'STATUS_SUCCEEDED', `status ${first.record.status}`);

  console.log('3. Begin again with the same request: a replay');
  const again = await idempotent(sidecar, {key, requestHash: requestHash(request)}, mustNotRun);
  check(again.outcome === 'OUTCOME_COMPLETED', `outcome ${again.outcome}`);
  check(Buffer.compare(again.result.body, body) === 0,
      `body replayed byte for byte (${again.result.body.length} bytes)`);
  check(again.result.code === 201, `code ${again.result.code}`);
  check(again.result.content_type === 'application/json',
      `content type ${again.result.content_type}`);
  check(JSON.stringify(again.result.headers) === JSON.stringify(headers),
      `headers ${JSON.stringify(again.result.headers)}`);
  console.log(`        ${again.result.body.toString('utf8')}`);

  console.log('4. Begin with the same key but another request');
  const other = {...request, amount_minor: 9999};
  const mismatch = await idempotent(sidecar, {key, requestHash: requestHash(other)}, mustNotRun);
  check(mismatch.outcome === 'OUTCOME_MISMATCH', `outcome ${mismatch.outcome}`);
  check(mismatch.record.result === null, 'no result snapshot on MISMATCH');

  console.log('all steps behaved as docs/spec.md says');
  sidecar.close();
}

if (process.argv.length !== 3) {
  console.error('usage: node walkthrough.js HOST:PORT');
  process.exit(2);
}
main(process.argv[2]).catch((err) => {
  console.error(`  FAIL  ${err.code !== undefined ? 'gRPC error ' : ''}${err.message}`);
  process.exit(1);
});
