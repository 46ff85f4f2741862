// A small Node client for the idempotency sidecar (docs/spec.md#api),
// on @grpc/grpc-js with the proto loaded at run time by @grpc/proto-loader.
//
//   const sidecar = connect('127.0.0.1:50051');
//   const r = await idempotent(sidecar, {key, requestHash}, async ({fencingToken}) => {
//     const payment = await writePayment(..., fencingToken);
//     return {code: 201, body: Buffer.from(JSON.stringify(payment)),
//             content_type: 'application/json'};
//   });
//   // r.outcome is 'OUTCOME_ACQUIRED' (we wrote) or the reason we did not;
//   // r.result is the snapshot to answer with (ours or the replayed one).
//
// Only an ACQUIRED attempt runs `work`. Throw BusinessError to record a
// failure. Any other error reports nothing: the write may or may not have
// happened, so the lease runs out and the sidecar's expiry policy decides
// (UNKNOWN by default) instead of a silent re-execution.
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.join(__dirname, '..', '..', 'proto');

// Loads idempotency.v1 from proto/. keepCase keeps the proto's field names
// (fencing_token); int64 fields arrive as strings so no precision is lost;
// enums arrive as their names ('OUTCOME_ACQUIRED').
function loadApi(protoDir = PROTO_DIR) {
  const definition = protoLoader.loadSync('idempotency/v1/idempotency.proto', {
    includeDirs: [protoDir],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  return grpc.loadPackageDefinition(definition).idempotency.v1;
}

// Returns a client of service Idempotency with promise-returning methods
// (begin, heartbeat, complete, fail, get), each with a deadline.
function connect(address, {timeoutMs = 5000} = {}) {
  const api = loadApi();
  const stub = new api.Idempotency(address, grpc.credentials.createInsecure());
  const unary = (method) => (request) =>
    new Promise((resolve, reject) => {
      stub[method](request, {deadline: Date.now() + timeoutMs}, (err, resp) =>
        err ? reject(err) : resolve(resp));
    });
  return {
    begin: unary('Begin'),
    heartbeat: unary('Heartbeat'),
    complete: unary('Complete'),
    fail: unary('Fail'),
    get: unary('Get'),
    close: () => stub.close(),
  };
}

// A google.protobuf.Duration for a number of milliseconds.
function duration(ms) {
  return {seconds: String(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6};
}

// Milliseconds of a google.protobuf.Duration (0 when unset).
function millis(d) {
  return d ? Number(d.seconds) * 1000 + Math.round(d.nanos / 1e6) : 0;
}

// A failure of the business write, recorded with Fail: `error` is a snapshot
// ({code, body, content_type, headers}), replayed unless `retryable`.
class BusinessError extends Error {
  constructor(error, {retryable = false} = {}) {
    super(`business error ${error.code}`);
    this.error = error;
    this.retryable = retryable;
  }
}

// Runs `work({fencingToken})` at most once per key and request: Begin; if
// ACQUIRED, work (heartbeating every leaseMs/3), then Complete with the
// snapshot it returns (or Fail on a BusinessError). Resolves to {outcome,
// record, result, retryAfterMs}; result is the snapshot to answer with (null
// for IN_PROGRESS, UNKNOWN and MISMATCH). gRPC errors reject (e.g. code 14
// UNAVAILABLE: retry later with the same key); an error from Complete or Fail
// carries the snapshot as err.result: the work has run, only its record is
// missing.
async function idempotent(client, {key, requestHash, leaseMs = 30000}, work) {
  const begin = await client.begin(
    {key, request_hash: requestHash, lease: duration(leaseMs)});
  const {outcome, record} = begin;
  if (outcome !== 'OUTCOME_ACQUIRED') {
    const replay = outcome === 'OUTCOME_COMPLETED' || outcome === 'OUTCOME_FAILED';
    return {outcome, record, result: replay ? record.result : null,
            retryAfterMs: millis(begin.retry_after)};
  }
  const token = begin.fencing_token;
  const timer = setInterval(() => {
    client.heartbeat({key, fencing_token: token, extend: duration(leaseMs)})
        .catch((err) => console.error(`heartbeat failed: ${err.message}`));
  }, Math.max(leaseMs / 3, 100));
  let snapshot;
  try {
    snapshot = await work({fencingToken: token});
  } catch (err) {
    if (!(err instanceof BusinessError)) throw err;
    const failed = await report(() => client.fail(
        {key, fencing_token: token, error: err.error, retryable: err.retryable}), err.error);
    return {outcome, record: failed.record, result: err.error, retryAfterMs: 0};
  } finally {
    clearInterval(timer);
  }
  const completed = await report(
      () => client.complete({key, fencing_token: token, result: snapshot}), snapshot);
  return {outcome, record: completed.record, result: snapshot, retryAfterMs: 0};
}

// Sends a Complete or Fail, retrying transient errors: both calls are
// idempotent for identical content. If it still fails, the error carries the
// snapshot as err.result (the record turns UNKNOWN when the lease runs out,
// for an operator to settle).
async function report(call, snapshot) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      const transient = err.code === grpc.status.UNAVAILABLE ||
          err.code === grpc.status.DEADLINE_EXCEEDED;
      if (!transient || attempt === 3) {
        err.result = snapshot;
        throw err;
      }
      await new Promise((resolve) => setTimeout(resolve, 200 * attempt));
    }
  }
}

module.exports = {
  BusinessError, connect, duration, idempotent, loadApi, millis, status: grpc.status,
};
