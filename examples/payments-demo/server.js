// Payments demo: `POST /payments` honouring the Idempotency-Key HTTP header
// (IETF draft "The Idempotency-Key HTTP Header Field") on top of the
// idempotency sidecar, with node:http, the Node client in ../node and `pg`.
//
// Environment: DEMO_IDEMPOTENCY ("sidecar", the default: the demo implements
// the header itself with the sidecar's gRPC API; "off": no idempotency code at
// all, for running behind the sidecar's HTTP gateway, docs/gateway.md),
// IDEM_ADDR (sidecar host:port), DEMO_POSTGRES (libpq conninfo or
// URI), DEMO_LISTEN (host:port), DEMO_TENANT (default payments-demo),
// DEMO_LEASE_MS (default 30000), DEMO_SLOW_MS (a slow payment provider: the
// write waits this long, heartbeating the lease meanwhile; default 0),
// DEMO_PROBE_LISTEN (host:port: also serve idempotency.v1.Reconciler there,
// plaintext gRPC; default off), DEMO_CRASH (tests only: "before-write" or
// "after-write" ends the process with code 137 at that point of a payment).
'use strict';

const crypto = require('node:crypto');
const http = require('node:http');
const db = require('./db');
const {BusinessError, connect, idempotent, status} = require('../node/idempotency');
const {ProbeError, serveReconciler} = require('./probe');

const config = {
  idempotency: process.env.DEMO_IDEMPOTENCY || 'sidecar',
  sidecar: process.env.IDEM_ADDR || '127.0.0.1:50051',
  postgres: process.env.DEMO_POSTGRES || 'host=127.0.0.1 port=5432 user=postgres dbname=postgres',
  listen: process.env.DEMO_LISTEN || '127.0.0.1:8080',
  tenant: process.env.DEMO_TENANT || 'payments-demo',
  leaseMs: Number(process.env.DEMO_LEASE_MS || 30000),
  slowMs: Number(process.env.DEMO_SLOW_MS || 0),
  probeListen: process.env.DEMO_PROBE_LISTEN || '',
  crash: process.env.DEMO_CRASH || '',
};
if (!['', 'before-write', 'after-write'].includes(config.crash)) {
  console.error(`payments-demo: DEMO_CRASH must be before-write or after-write, not ${config.crash}`);
  process.exit(2);
}
if (!['sidecar', 'off'].includes(config.idempotency)) {
  console.error(`payments-demo: DEMO_IDEMPOTENCY must be sidecar or off, not ${config.idempotency}`);
  process.exit(2);
}
// The probe answers for keyed attempts, which off mode does not have.
if (config.idempotency === 'off' && config.probeListen !== '') {
  console.error('payments-demo: DEMO_PROBE_LISTEN needs DEMO_IDEMPOTENCY=sidecar');
  process.exit(2);
}
const OPERATION = 'create-payment';
// Larger payments are declined: a business failure, recorded and replayed.
const LIMIT_MINOR = 1_000_000;
const MAX_BODY_BYTES = 64 * 1024;

// A snapshot (what the sidecar stores and replays) of an HTTP response.
function jsonSnapshot(code, value, headers = {}, contentType = 'application/json') {
  return {code, body: Buffer.from(JSON.stringify(value)), content_type: contentType, headers};
}

// The 201 response for a stored payment: built from the payment's fields in a
// fixed order, so that the response sent in Complete and the one Probe rebuilds
// from the payments row later are the same bytes.
function paymentResponse({payment_id, amount_minor, currency, payee}) {
  return jsonSnapshot(201, {payment_id, amount_minor, currency, payee},
      {location: `/payments/${payment_id}`});
}

// An RFC 9457 problem response, as a snapshot.
function problem(code, title, detail, headers = {}) {
  return jsonSnapshot(code, {type: 'about:blank', title, status: code, detail}, headers,
      'application/problem+json');
}

// The business decline of a payment above the limit.
function declined() {
  return problem(402, 'Payment declined', `amount_minor above the limit of ${LIMIT_MINOR}`);
}

function send(res, snapshot, extraHeaders = {}) {
  res.writeHead(snapshot.code, {
    ...snapshot.headers,
    ...(snapshot.content_type ? {'content-type': snapshot.content_type} : {}),
    'content-length': snapshot.body.length,
    ...extraHeaders,
  });
  res.end(snapshot.body);
}

// JSON with object keys sorted at every level and no spaces: equal requests
// give equal bytes however the client ordered or spaced them.
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    return `{${Object.keys(value).sort()
        .map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

// The request_hash of a validated payment request: SHA-256 of its canonical JSON.
function requestHash({amount_minor, currency, payee}) {
  return crypto.createHash('sha256')
      .update(canonicalJson({amount_minor, currency, payee})).digest();
}

// The header's value: a Structured Field string ("...") per the draft, or
// a bare token for lenient clients; null when absent or empty.
function idempotencyKey(header) {
  if (header === undefined) return null;
  const quoted = /^"((?:[^"\\]|\\["\\])*)"$/.exec(header.trim());
  const key = quoted ? quoted[1].replace(/\\(["\\])/g, '$1') : header.trim();
  return key === '' ? null : key;
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(Object.assign(new Error('request body too large'), {httpStatus: 413}));
        req.destroy();
      } else {
        chunks.push(chunk);
      }
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

// Parses and validates {"amount_minor": 1250, "currency": "EUR", "payee": "acme"};
// throws an Error whose message says what is wrong.
function parsePayment(body) {
  let value;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw new Error(`body is not JSON: ${err.message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new Error('body must be a JSON object');
  }
  for (const field of Object.keys(value)) {
    if (!['amount_minor', 'currency', 'payee'].includes(field)) {
      throw new Error(`unknown field "${field}"`);
    }
  }
  if (!Number.isSafeInteger(value.amount_minor) || value.amount_minor <= 0) {
    throw new Error('amount_minor must be a positive integer');
  }
  if (typeof value.currency !== 'string' || !/^[A-Z]{3}$/.test(value.currency)) {
    throw new Error('currency must be an ISO 4217 code such as "EUR"');
  }
  if (typeof value.payee !== 'string' || value.payee.length < 1 || value.payee.length > 200) {
    throw new Error('payee must be a string of 1 to 200 characters');
  }
  return value;
}

// Thrown by a write that the fencing token refused: a newer attempt owns the key.
class StaleAttempt extends Error {}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Test hook: dies like a killed process (exit code 137) at `point` of a
// payment when DEMO_CRASH names it. The lease then runs out: UNKNOWN.
function crashPoint(point, key) {
  if (config.crash !== point) return;
  console.error(`DEMO_CRASH=${point}: exiting during key=${JSON.stringify(key)}`);
  process.exit(137);
}

// Keys whose attempt is running in this process, with its fencing token.
const inFlight = new Map();

// The business write, run only by the attempt that acquired the key. Returns
// the snapshot of the 201 response, or throws a BusinessError for a failure.
async function createPayment(pool, key, request, fencingToken) {
  crashPoint('before-write', key);
  const token = Number(fencingToken);  // int64 arrives as a string
  inFlight.set(key, token);
  try {
    return await writeAndRespond(pool, key, request, token);
  } finally {
    if (inFlight.get(key) === token) inFlight.delete(key);
  }
}

async function writeAndRespond(pool, key, request, fencingToken) {
  if (request.amount_minor > LIMIT_MINOR) {
    throw new BusinessError(declined(), {retryable: false});
  }
  if (config.slowMs > 0) await sleep(config.slowMs);  // the payment provider
  const payment = {...request, payment_id: `pay_${crypto.randomUUID()}`};
  let stored;
  try {
    stored = await db.writePayment(pool, key, payment, fencingToken);
  } catch (err) {
    // Safe to let the next attempt run again even if this write did commit:
    // the row is keyed by the idempotency key and the next attempt's higher
    // fencing token replaces it, so there is still one payment per key.
    console.error(`payment write failed: ${err.message}`);
    throw new BusinessError(problem(503, 'Payment store unavailable',
        'The payment could not be stored; retry with the same Idempotency-Key.',
        {'retry-after': '1'}), {retryable: true});
  }
  if (!stored) throw new StaleAttempt('a newer attempt owns this key');
  crashPoint('after-write', key);
  return paymentResponse(payment);
}

// Reconciler.Probe: did attempt `fencingToken` of `key` write its payment?
// Read-only. The payments row is the truth; one row per key, fenced by token.
//  - the row has this token (and this request): APPLIED, with the 201
//    response Complete would have stored, rebuilt by the same function;
//  - no row, or an older attempt's row: NOT_APPLIED. Safe even if the attempt
//    were still writing somewhere: its row would be replaced by the retry's
//    (higher token) or refused after it, so the key keeps one payment;
//  - the attempt is still running in this process: INDETERMINATE (its own
//    Complete may still come);
//  - a newer attempt's row, or a row that is not this request: INDETERMINATE.
//    The record and the table disagree; a person should look.
async function probePayment(pool, {key, requestHash: hash, fencingToken}) {
  if (key.tenant !== config.tenant || key.operation !== OPERATION) {
    throw new ProbeError(status.INVALID_ARGUMENT,
        `key: this service answers for tenant ${config.tenant}, operation ` +
        `${OPERATION}, not ${key.tenant}/${key.operation}`);
  }
  const attempt = `attempt ${fencingToken}`;
  if (inFlight.get(key.key) === fencingToken) {
    return {verdict: 'VERDICT_INDETERMINATE', detail: `${attempt} is still running here`};
  }
  const row = await db.findPayment(pool, key.key);
  if (row === null) {
    return {verdict: 'VERDICT_NOT_APPLIED', detail: `no payment for this key: ${attempt} did not write`};
  }
  const id = row.payment_id;
  if (row.fencing_token < fencingToken) {
    return {verdict: 'VERDICT_NOT_APPLIED', detail: `${attempt} did not write; the stored ` +
        `payment ${id} is attempt ${row.fencing_token}'s, which a retry replaces`};
  }
  if (row.fencing_token > fencingToken) {
    return {verdict: 'VERDICT_INDETERMINATE', detail: `payment ${id} belongs to attempt ` +
        `${row.fencing_token}, newer than ${attempt}: record and payments table disagree`};
  }
  if (!requestHash(row).equals(hash)) {
    return {verdict: 'VERDICT_INDETERMINATE',
            detail: `payment ${id} of ${attempt} is not the record's request (hash differs)`};
  }
  return {verdict: 'VERDICT_APPLIED', result: paymentResponse(row),
          detail: `payment ${id} written by ${attempt}`};
}

// POST /payments. Answers per the draft: 400 without the header, 422 when the
// key was used with another request, 409 while the first request is still
// being processed, and a replay of the first response afterwards.
async function postPayment(sidecar, pool, req, res) {
  const key = idempotencyKey(req.headers['idempotency-key']);
  if (key === null) {
    return send(res, problem(400, 'Idempotency-Key is missing',
        'This operation is idempotent and requires the Idempotency-Key header.'));
  }
  let request;
  try {
    request = parsePayment(await readBody(req));
  } catch (err) {
    return send(res, problem(err.httpStatus || 400, 'Invalid request', err.message));
  }
  const recordKey = {tenant: config.tenant, operation: OPERATION, key};

  let r;
  try {
    r = await idempotent(sidecar,
        {key: recordKey, requestHash: requestHash(request), leaseMs: config.leaseMs},
        ({fencingToken}) => createPayment(pool, key, request, fencingToken));
  } catch (err) {
    return sendError(res, key, err);
  }
  log(key, r.outcome, `${r.result ? r.result.code : ''} token ${r.record.fencing_token}`);
  switch (r.outcome) {
    case 'OUTCOME_ACQUIRED':
      return send(res, r.result);
    case 'OUTCOME_COMPLETED':
    case 'OUTCOME_FAILED':
      return send(res, r.result, {'idempotent-replayed': 'true'});
    case 'OUTCOME_IN_PROGRESS':
      return send(res, problem(409, 'Request in progress',
          'A request with this Idempotency-Key is still being processed; retry later.',
          {'retry-after': String(Math.max(1, Math.ceil(r.retryAfterMs / 1000)))}));
    case 'OUTCOME_MISMATCH':
      return send(res, problem(422, 'Idempotency-Key reused',
          'This Idempotency-Key was already used with a different request body.'));
    case 'OUTCOME_UNKNOWN':
      return send(res, problem(503, 'Outcome unknown',
          'An earlier request with this Idempotency-Key may or may not have been carried ' +
          'out. It will not be executed again until it is settled (by the sidecar\'s ' +
          'reconciler or an operator). Retrying with the same key returns the settled ' +
          'result.', {'retry-after': '5'}));
    default:
      throw new Error(`unexpected outcome ${r.outcome}`);
  }
}

// Maps a failure around the write to a response. Never re-executes anything.
function sendError(res, key, err) {
  if (err instanceof StaleAttempt || err.code === status.FAILED_PRECONDITION) {
    log(key, 'superseded', err.message);
    return send(res, problem(409, 'Request superseded',
        'A newer attempt owns this Idempotency-Key; retry to get its result.',
        {'retry-after': '1'}));
  }
  if (err.result) {
    // The write ran but its result could not be recorded: answer with it
    // anyway. Retries see IN_PROGRESS, then UNKNOWN for an operator.
    log(key, 'answered, not recorded', err.message);
    return send(res, err.result);
  }
  if (err.code === status.INVALID_ARGUMENT) {
    return send(res, problem(400, 'Invalid request', err.details));
  }
  if (err.code !== undefined) {
    log(key, 'sidecar error', err.message);
    return send(res, problem(503, 'Idempotency service unavailable',
        'Nothing was done; retry with the same Idempotency-Key.', {'retry-after': '1'}));
  }
  throw err;
}

// POST /payments with DEMO_IDEMPOTENCY=off: no key, no record, no fencing; the
// gateway in front owns all of that. Every request that arrives is executed:
// validate, decline or insert a new row (idempotency_key and fencing_token
// NULL), and answer as the sidecar mode's first attempt does. A write that
// fails may have committed, so it gets no answer at all: the gateway then
// records nothing and the key turns UNKNOWN instead of being run again.
async function postPaymentOff(pool, req, res) {
  let request;
  try {
    request = parsePayment(await readBody(req));
  } catch (err) {
    return send(res, problem(err.httpStatus || 400, 'Invalid request', err.message));
  }
  const payment = {...request, payment_id: `pay_${crypto.randomUUID()}`};
  crashPoint('before-write', payment.payment_id);
  if (request.amount_minor > LIMIT_MINOR) return send(res, declined());
  if (config.slowMs > 0) await sleep(config.slowMs);  // the payment provider
  try {
    await db.insertPayment(pool, payment);
  } catch (err) {
    console.error(`payment write failed, not answering: ${err.message}`);
    return res.destroy();
  }
  crashPoint('after-write', payment.payment_id);
  console.log(`POST /payments ${payment.payment_id} created`);
  return send(res, paymentResponse(payment));
}

async function route(sidecar, pool, req, res) {
  if (new URL(req.url, 'http://demo').pathname !== '/payments') {
    return send(res, problem(404, 'Not found', `no resource ${req.url}`));
  }
  if (req.method !== 'POST') {
    return send(res, problem(405, 'Method not allowed', 'use POST'), {allow: 'POST'});
  }
  if (sidecar === null) return postPaymentOff(pool, req, res);
  return postPayment(sidecar, pool, req, res);
}

function log(key, what, detail) {
  console.log(`POST /payments key=${JSON.stringify(key)} ${what} ${detail}`);
}

async function main() {
  const pool = await db.open(config.postgres);
  if (config.idempotency === 'off') await db.checkKeyless(pool);
  let probe = null;
  if (config.probeListen !== '') {
    probe = await serveReconciler(config.probeListen, (request) => probePayment(pool, request));
    console.log(`payments-demo serving idempotency.v1.Reconciler on ${config.probeListen}`);
  }
  const sidecar = config.idempotency === 'sidecar' ? connect(config.sidecar) : null;
  const server = http.createServer((req, res) => {
    route(sidecar, pool, req, res).catch((err) => {
      console.error(err);
      if (!res.headersSent) send(res, problem(500, 'Internal error', err.message));
      else res.destroy();
    });
  });
  const [, host, port] = /^(.*):(\d+)$/.exec(config.listen) || [];
  if (port === undefined) throw new Error(`DEMO_LISTEN must be host:port, not ${config.listen}`);
  server.listen(Number(port), host.replace(/^\[(.*)\]$/, '$1'), () => {
    console.log(`payments-demo listening on http://${config.listen}` +
        (sidecar === null ? ' (idempotency off: behind the gateway)' :
                            ` (sidecar ${config.sidecar}, tenant ${config.tenant})`));
  });
  const stop = () => server.close(() => {
    if (sidecar !== null) sidecar.close();
    if (probe !== null) probe.forceShutdown();
    pool.end();
  });
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((err) => {
  console.error(`payments-demo: ${err.message}`);
  process.exit(1);
});
