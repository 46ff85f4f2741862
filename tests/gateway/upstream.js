// The service behind the gateway in tests/gateway_pgtest.cc: an HTTP/1.1
// server (node:http only) that counts how often each request was executed.
//
//   node upstream.js --port=PORT --log=FILE    (or UPSTREAM_PORT, UPSTREAM_LOG)
//
// Listens on 127.0.0.1:PORT. Every request other than the /__ ones below is
// an execution: it is appended to FILE as one JSON line {seq, method, path,
// query, body, key} (body as base64, key the Idempotency-Key header as it
// arrived, or null) before anything else happens. The file outlives the
// process: a restarted upstream reads it back, so its counts and sequence
// numbers go on where the killed one stopped.
//
// How to answer is a list of controls, separated by ';' in the header
// `x-test-behavior` (e.g. `x-test-behavior: status=503;delay=200`), or given
// as query parameters of the same names (`?status=503&delay=200`); the header
// wins. A header is not part of the gateway's fingerprint, so a retry may
// drop it and ask for another answer under the same key.
//
//   (none)              201, JSON {execution, method, path, count, body_bytes,
//                       note} with `location: /executions/<execution>`,
//                       `x-upstream-execution: <execution>` and
//                       `set-cookie: session=<execution>` (a header the
//                       gateway does not record by default); `note` has
//                       non-ASCII text, to prove byte-exact replays.
//   status=NNN          answer NNN instead of 201 (same body).
//   delay=MS            wait MS milliseconds before answering.
//   die-after-execute   record the execution, then exit with code 137
//                       without answering (killed after it executed but
//                       before it answered).
//
// Not executions:
//   GET /__count?path=P  {"path": P, "count": N}: executions of path P
//                        (without the query) so far.
//   GET /__log           the executions so far, as a JSON array.
//   GET /__connections   {"accepted": N}: connections this process accepted
//                        (the gateway's keep-alive shows in it).
'use strict';

const fs = require('node:fs');
const http = require('node:http');

function option(name) {
  const prefix = `--${name}=`;
  const arg = process.argv.slice(2).find((a) => a.startsWith(prefix));
  if (arg !== undefined) return arg.slice(prefix.length);
  return process.env[`UPSTREAM_${name.toUpperCase()}`];
}

const port = Number(option('port'));
const logPath = option('log');
if (!Number.isInteger(port) || port <= 0 || !logPath) {
  console.error('usage: node upstream.js --port=PORT --log=FILE');
  process.exit(2);
}

// The executions so far, from the file a previous run may have left.
const executions = fs.existsSync(logPath)
  ? fs
      .readFileSync(logPath, 'utf8')
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => JSON.parse(line))
  : [];

function countOf(path) {
  return executions.filter((e) => e.path === path).length;
}

// The controls of a request: the header's if it has one, else the query's.
function controls(req, url) {
  const out = new Map();
  const header = req.headers['x-test-behavior'];
  if (header !== undefined) {
    for (const part of header.split(';')) {
      const item = part.trim();
      if (item === '') continue;
      const eq = item.indexOf('=');
      if (eq < 0) out.set(item, '');
      else out.set(item.slice(0, eq), item.slice(eq + 1));
    }
    return out;
  }
  for (const [name, value] of url.searchParams) out.set(name, value);
  return out;
}

function sendJson(res, status, value, headers = {}) {
  const body = Buffer.from(JSON.stringify(value));
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': body.length,
    ...headers,
  });
  res.end(body);
}

function execute(req, res, url, body) {
  const key = req.headers['idempotency-key'];
  const entry = {
    seq: executions.length + 1,
    method: req.method,
    path: url.pathname,
    query: url.search,
    body: body.toString('base64'),
    key: key === undefined ? null : key,
  };
  fs.appendFileSync(logPath, JSON.stringify(entry) + '\n');
  executions.push(entry);

  const c = controls(req, url);
  if (c.has('die-after-execute')) {
    process.exit(137);
  }
  const status = c.has('status') ? Number(c.get('status')) : 201;
  const count = countOf(entry.path);
  const answer = () =>
    sendJson(
      res,
      status,
      {
        execution: entry.seq,
        method: entry.method,
        path: entry.path,
        count,
        body_bytes: body.length,
        note: 'exécution n° ' + entry.seq + ' ✓',
      },
      {
        location: `/executions/${entry.seq}`,
        'x-upstream-execution': String(entry.seq),
        'set-cookie': `session=${entry.seq}`,
      },
    );
  const delay = c.has('delay') ? Number(c.get('delay')) : 0;
  if (delay > 0) setTimeout(answer, delay);
  else answer();
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://upstream');
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    if (req.method === 'GET' && url.pathname === '/__count') {
      const path = url.searchParams.get('path') || '';
      sendJson(res, 200, { path, count: countOf(path) });
    } else if (req.method === 'GET' && url.pathname === '/__log') {
      sendJson(res, 200, executions);
    } else if (req.method === 'GET' && url.pathname === '/__connections') {
      sendJson(res, 200, { accepted });
    } else {
      execute(req, res, url, body);
    }
  });
});
let accepted = 0;
server.on('connection', () => {
  accepted += 1;
});
server.keepAliveTimeout = 30000;
server.listen(port, '127.0.0.1', () => {
  console.log(`upstream listening on 127.0.0.1:${port}, log ${logPath}`);
});
