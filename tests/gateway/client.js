// A real HTTP client for tests/gateway_pgtest.cc: Node's built-in fetch.
//
//   node client.js SPEC_JSON
//
// SPEC_JSON: {"requests": [{"url": ..., "method": "POST", "headers": {...},
// "body": "...", "retry_409": true}, ...]}. All requests start at once
// (Promise.all). With retry_409, a 409 answer is retried with the same
// request after its Retry-After (seconds; 200 ms without one), for at most
// 20 s, like a client that honours the header.
//
// Prints one JSON line: {"results": [{"attempts": [{"status": N,
// "headers": {name: value}, "body_base64": "..."}, ...]}, ...]} in the order
// of the requests; names in lower case, repeated fields joined with ", ". A
// request that fails (no answer) ends its attempts with {"error": "..."}.
'use strict';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function once(request) {
  try {
    const response = await fetch(request.url, {
      method: request.method || 'GET',
      headers: request.headers || {},
      body: request.body,
    });
    const body = Buffer.from(await response.arrayBuffer());
    return {
      status: response.status,
      headers: Object.fromEntries(response.headers),
      body_base64: body.toString('base64'),
    };
  } catch (e) {
    return { error: String(e.cause || e) };
  }
}

async function run(request) {
  const attempts = [];
  const end = Date.now() + 20000;
  for (;;) {
    const attempt = await once(request);
    attempts.push(attempt);
    if (!request.retry_409 || attempt.status !== 409 || Date.now() > end) {
      return { attempts };
    }
    const seconds = Number(attempt.headers['retry-after']);
    await sleep(Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 200);
  }
}

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const results = await Promise.all(spec.requests.map(run));
  process.stdout.write(JSON.stringify({ results }) + '\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
