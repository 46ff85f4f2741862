// The gRPC side of reconciliation: serves idempotency.v1.Reconciler (proto/
// idempotency/v1/reconciler.proto) so that the sidecar can ask whether the
// write of an UNKNOWN record's attempt happened. The verdict itself is the
// business service's to give (see probePayment in server.js); this file is
// only the plumbing, over plaintext gRPC.
//
// The gRPC packages are the Node client's (../node), which the demo already
// installs and uses: one copy, one version.
'use strict';

const path = require('node:path');
const {createRequire} = require('node:module');

const nodeClient = createRequire(path.join(__dirname, '..', 'node', 'package.json'));
const grpc = nodeClient('@grpc/grpc-js');
const protoLoader = nodeClient('@grpc/proto-loader');

const PROTO_DIR = path.join(__dirname, '..', '..', 'proto');

// Loads idempotency.v1.Reconciler with the same options as the Node client:
// proto field names, int64 as strings, enums as names.
function loadReconciler() {
  const definition = protoLoader.loadSync('idempotency/v1/reconciler.proto', {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  return grpc.loadPackageDefinition(definition).idempotency.v1.Reconciler;
}

// An error that Probe answers as a gRPC status instead of a verdict.
class ProbeError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// Serves Reconciler.Probe on `address` (host:port, plaintext). `probe` gets
// {key, requestHash (Buffer), fencingToken (Number)} and resolves to
// {verdict: 'VERDICT_...', result (a snapshot, with APPLIED), detail}; a
// rejection becomes the call's status (UNAVAILABLE unless it is a
// ProbeError). Resolves to the started grpc.Server.
function serveReconciler(address, probe) {
  const server = new grpc.Server();
  server.addService(loadReconciler().service, {
    Probe: (call, callback) => {
      const {request_hash: requestHash, fencing_token: token} = call.request;
      const key = call.request.key || {tenant: '', operation: '', key: ''};
      const what = `Probe ${key.tenant}/${key.operation}/${key.key} token=${token}:`;
      probe({key, requestHash, fencingToken: Number(token)}).then(
          (answer) => {
            console.log(`${what} ${answer.verdict} (${answer.detail})`);
            callback(null, answer);
          },
          (err) => {
            console.log(`${what} error ${err.message}`);
            callback({
              code: err instanceof ProbeError ? err.code : grpc.status.UNAVAILABLE,
              details: err.message,
            });
          });
    },
  });
  return new Promise((resolve, reject) => {
    server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (err) =>
      err ? reject(new Error(`DEMO_PROBE_LISTEN ${address}: ${err.message}`)) :
            resolve(server));
  });
}

module.exports = {ProbeError, serveReconciler, status: grpc.status};
