#!/usr/bin/env node
'use strict';
// Why this exists: no Debian 12 package does these checks. The policies
// (2) and the checks against the built binaries (4) are the project's own;
// no packaged tool validates manifests against the API schemas offline
// (kubeconform and kubeval are not in Debian 12, and Debian's kubectl 1.20
// validates only against a live API server, with schemas that predate gRPC
// probes and native sidecars); rendering: see render.js.
//
// Renders the kustomize layouts under deploy/k8s/ and validates them:
//   1. every rendered object, and every *.example.yaml object, against the
//      Kubernetes API schema (kubernetes-models' validate(): types, enums,
//      required fields) and for unknown fields (strict.js)
//   2. the project's policies (policy.js): restricted securityContext,
//      resources, pinned images, probes (gRPC on a network listener, exec
//      idemctl on a loopback one), native sidecar, graceful shutdown,
//      Prometheus annotations, Secret/ConfigMap/ServiceAccount references,
//      selectors, PodDisruptionBudget, NetworkPolicy, a migration Job, and
//      the HTTP gateway as the pod's only entry (Service on its port, the
//      application on loopback, no probe dialling the application)
//   3. with kubectl installed: that this renderer's output equals
//      `kubectl kustomize`
//   4. with --sidecar BIN: every flag and IDEM_* variable the manifests give
//      the sidecar exists in BIN --help, and BIN accepts each mounted
//      --config file (with the manifest's --http-upstream, and an
//      --http-listen of its own, when the container serves the gateway);
//      with --idemctl BIN too: the exec probes, run against a
//      real sidecar, pass when it is SERVING, and behave as documented when
//      it is NOT_SERVING or gone; gRPC probe service names are ones the
//      sidecar serves
//
// usage: node validate.js [--sidecar BIN] [--idemctl BIN] [--no-kubectl] [LAYOUT_DIR...]
// (default layouts: deploy/k8s/shared, pod-sidecar and pod-gateway). Exit 0:
// all passed; 1: errors (listed); 2: usage.

const childProcess = require('child_process');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const yaml = require('js-yaml');

const { render, RenderError, loadYamlDocs, podSpecs, allContainers } = require('./render');
const { unknownFields, declarationFor } = require('./strict');
const { checkLayout, sidecarSettings, isSidecarImage, isLoopback, id } = require('./policy');

const DOCKERFILE = path.resolve(__dirname, '../../docker/Dockerfile');

function parseArgs(argv) {
  const opts = { sidecar: null, idemctl: null, kubectl: true, layouts: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--sidecar' || a === '--idemctl') {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a path`);
      opts[a.slice(2)] = path.resolve(argv[++i]);
    } else if (a === '--no-kubectl') {
      opts.kubectl = false;
    } else if (a === '-h' || a === '--help') {
      opts.help = true;
    } else if (a.startsWith('-')) {
      throw new Error(`unknown option ${a}`);
    } else {
      opts.layouts.push(path.resolve(a));
    }
  }
  if (!opts.layouts.length) {
    opts.layouts = ['shared', 'pod-sidecar', 'pod-gateway'].map((d) => path.resolve(__dirname, '..', d));
  }
  return opts;
}

// ---- 1. schema and unknown fields
function schemaErrors(obj) {
  if (!obj || typeof obj !== 'object' || !obj.apiVersion || !obj.kind) return ['missing apiVersion or kind'];
  if (!declarationFor(obj.apiVersion, obj.kind)) return [`no Kubernetes API type ${obj.apiVersion} ${obj.kind} (kubernetes-models)`];
  const Model = require(`kubernetes-models/${obj.apiVersion}/${obj.kind}`)[obj.kind];
  const errors = [];
  try {
    new Model(JSON.parse(JSON.stringify(obj))).validate();
  } catch (e) {
    if (Array.isArray(e.errors)) {
      for (const err of e.errors) {
        const at = (err.instancePath || '').replace(/^\//, '').replace(/\//g, '.');
        errors.push(`${at || '(object)'}: ${err.message}`);
      }
    } else {
      errors.push(e.message);
    }
  }
  return errors.concat(unknownFields(obj));
}

// ---- 3. kubectl kustomize cross-check
function which(cmd) {
  const r = childProcess.spawnSync('sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
}

function normalizeHashes(objects, names) {
  let text = JSON.stringify(objects);
  for (const n of names) text = text.split(new RegExp(`"${n}-[a-z0-9]{10}"`)).join(`"${n}-HASH"`);
  return JSON.parse(text);
}

function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === 'object') {
    const out = {};
    for (const k of Object.keys(value).sort()) out[k] = canonical(value[k]);
    return out;
  }
  return value;
}

function kubectlCheck(dir, mine, report) {
  const r = childProcess.spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8', timeout: 60000 });
  if (r.status !== 0) {
    report.note(`kubectl kustomize failed, renderer not cross-checked: ${(r.stderr || r.error || '').toString().trim()}`);
    return;
  }
  const theirs = yaml.loadAll(r.stdout).filter(Boolean);
  const key = (o) => `${o.apiVersion} ${o.kind} ${o.metadata.namespace || ''}/${o.metadata.name}`;
  const sortByKey = (list) => [...list].sort((a, b) => key(a).localeCompare(key(b)));
  const a = JSON.stringify(canonical(sortByKey(JSON.parse(JSON.stringify(mine)))));
  const b = JSON.stringify(canonical(sortByKey(theirs)));
  if (a === b) {
    report.ok(`renderer output equals kubectl kustomize (${theirs.length} objects)`);
    return;
  }
  const generated = mine.filter((o) => o.kind === 'ConfigMap' && /-[a-z0-9]{10}$/.test(o.metadata.name))
    .map((o) => o.metadata.name.slice(0, -11));
  const na = JSON.stringify(canonical(sortByKey(normalizeHashes(JSON.parse(JSON.stringify(mine)), generated))));
  const nb = JSON.stringify(canonical(sortByKey(normalizeHashes(theirs, generated))));
  if (na === nb) {
    report.note('renderer output equals kubectl kustomize except for ConfigMap name hashes (another kustomize version)');
    return;
  }
  const mineKeys = new Set(mine.map(key));
  const theirKeys = new Set(theirs.map(key));
  const onlyMine = [...mineKeys].filter((k) => !theirKeys.has(k));
  const onlyTheirs = [...theirKeys].filter((k) => !mineKeys.has(k));
  let detail = '';
  if (onlyMine.length || onlyTheirs.length) {
    detail = `only here: ${onlyMine.join(', ') || '-'}; only in kubectl: ${onlyTheirs.join(', ') || '-'}`;
  } else {
    const theirsByKey = new Map(theirs.map((o) => [key(o), o]));
    const differing = mine.filter((o) => JSON.stringify(canonical(JSON.parse(JSON.stringify(o)))) !== JSON.stringify(canonical(theirsByKey.get(key(o)))));
    detail = `objects differ: ${differing.map(key).join(', ')}`;
  }
  report.error(`renderer output differs from kubectl kustomize (${detail}); deploy/k8s/validate/render.js no longer renders this kustomization faithfully`);
}

// ---- 4. against the real binaries
function run(cmd, args, opts = {}) {
  return childProcess.spawnSync(cmd, args, { encoding: 'utf8', timeout: 20000, ...opts });
}

function cleanEnv() {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('IDEM_')) env[k] = v;
  return env;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Starts the sidecar; resolves {proc, output} once it logs "serving", or
// rejects with its output if it exits first or takes longer than 15 s.
function startSidecar(bin, args) {
  return new Promise((resolve, reject) => {
    const proc = childProcess.spawn(bin, args, { env: cleanEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    let done = false;
    const finish = (fn, v) => { if (!done) { done = true; clearTimeout(timer); fn(v); } };
    const onData = (d) => {
      output += d;
      if (output.includes('"msg":"serving"')) finish(resolve, { proc, output: () => output });
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => finish(reject, new Error(`exited with ${code} before serving:\n${output.trim()}`)));
    proc.on('error', (e) => finish(reject, e));
    const timer = setTimeout(() => { proc.kill('SIGKILL'); finish(reject, new Error(`not serving after 15s:\n${output.trim()}`)); }, 15000);
  });
}

function stopSidecar(s) {
  return new Promise((resolve) => {
    if (s.proc.exitCode !== null) { resolve(s.proc.exitCode); return; }
    const timer = setTimeout(() => s.proc.kill('SIGKILL'), 20000);
    s.proc.on('exit', (code, signal) => { clearTimeout(timer); resolve(signal ? signal : code); });
    s.proc.kill('SIGTERM');
  });
}

function helpText(bin, args) {
  const r = run(bin, args);
  if (r.status !== 0) throw new Error(`${bin} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return r.stdout + r.stderr;
}

function sidecarContainers(objects) {
  const out = [];
  for (const obj of objects) {
    for (const spec of podSpecs(obj)) {
      for (const c of allContainers(spec)) if (isSidecarImage(c.image)) out.push({ obj, spec, c });
    }
  }
  return out;
}

function checkFlagsAgainstHelp(objects, sidecar, report) {
  const main = helpText(sidecar, ['--help']);
  const migrate = helpText(sidecar, ['migrate', '--help']);
  let n = 0;
  const before = report.errors;
  for (const { obj, c } of sidecarContainers(objects)) {
    const s = sidecarSettings(c);
    const help = s.subcommand === 'migrate' ? main + migrate : main;
    const at = `${id(obj)} container ${c.name}`;
    for (const flag of s.flags.keys()) {
      n++;
      if (!new RegExp(`(^|[\\s,])${flag.replace(/[-]/g, '\\-')}([\\s=,]|$)`, 'm').test(help)) {
        report.error(`${at}: flag ${flag} is not in \`idempotency-sidecar${s.subcommand ? ` ${s.subcommand}` : ''} --help\``);
      }
    }
    for (const name of s.env.keys()) {
      if (!name.startsWith('IDEM_')) continue;
      n++;
      if (!new RegExp(`\\b${name}\\b`).test(help)) {
        report.error(`${at}: env ${name} is not mentioned by \`idempotency-sidecar --help\` (not a setting of this binary)`);
      }
    }
  }
  if (report.errors === before) report.ok(`${n} sidecar flags and IDEM_* variables exist in ${path.basename(sidecar)} --help`);
}

async function checkConfigs(objects, configs, sidecar, report) {
  for (const cfg of configs) {
    const cm = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === cfg.configMap && (o.metadata.namespace || '') === (cfg.namespace || ''));
    if (!cm || !cm.data || typeof cm.data[cfg.key] !== 'string') {
      report.error(`${cfg.at}: --config needs key ${cfg.key} of ConfigMap ${cfg.configMap}, which is not rendered`);
      continue;
    }
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-config-'));
    const file = path.join(dir, cfg.key);
    fs.writeFileSync(file, cm.data[cfg.key]);
    try {
      const args = ['--store=memory', '--listen=127.0.0.1:0', '--metrics-listen=127.0.0.1:0', `--config=${file}`];
      if (cfg.httpUpstream) args.push(`--http-listen=127.0.0.1:${await freePort()}`, `--http-upstream=${cfg.httpUpstream}`);
      const s = await startSidecar(sidecar, args);
      const code = await stopSidecar(s);
      if (code !== 0) report.error(`${cfg.at}: the sidecar with ConfigMap ${cfg.configMap} exited ${code} on SIGTERM`);
      else report.ok(`the sidecar accepts --config from ConfigMap ${cfg.configMap} (${cfg.key}) and stops cleanly on SIGTERM`);
    } catch (e) {
      report.error(`${cfg.at}: the sidecar rejects the --config file from ConfigMap ${cfg.configMap}: ${e.message}`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
}

// Runs an exec probe's command with the sidecar address and idemctl path
// replaced by the test ones. Returns the exit status.
function runExecProbe(command, listen, addr, idemctl) {
  const cmd = command.map((part) => part
    .split(`--addr=${listen}`).join(`--addr=${addr}`)
    .replace(/(^|[\s])\/[^\s]*\/idemctl(?=\s|$)/g, `$1${idemctl}`)
    .replace(/^\/[^\s]*\/idemctl$/, idemctl));
  const r = run(cmd[0], cmd.slice(1), { env: cleanEnv() });
  return r.status === null ? -1 : r.status;
}

async function checkProbes(objects, servers, sidecar, idemctl, report) {
  const dockerfile = fs.existsSync(DOCKERFILE) ? fs.readFileSync(DOCKERFILE, 'utf8') : '';
  // The health service names the sidecar serves.
  const port = await freePort();
  let served = null;
  const up = await startSidecar(sidecar, ['--store=memory', `--listen=127.0.0.1:${port}`, '--metrics-listen=127.0.0.1:0']);
  try {
    const r = run(idemctl, [`--addr=127.0.0.1:${port}`, '--json', 'health'], { env: cleanEnv() });
    served = new Set(Object.keys(JSON.parse(r.stdout).services || {}).sort());
  } catch (e) {
    report.error(`cannot read the health services from idemctl --json health: ${e.message}`);
  } finally {
    await stopSidecar(up);
  }
  const execProbes = [];
  const before = report.errors;
  for (const srv of servers) {
    const at = `${id(srv.obj)} container ${srv.c.name}`;
    for (const kind of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
      const p = srv.c[kind];
      if (!p) continue;
      if (p.grpc && served) {
        const svc = p.grpc.service || '';
        if (!served.has(svc)) report.error(`${at}: ${kind} asks for health service "${svc}", which the sidecar does not serve (it serves ${[...served].map((x) => `"${x}"`).join(', ')})`);
      }
      if (p.exec && p.exec.command) {
        for (const part of p.exec.command) {
          for (const m of part.matchAll(/(\/[^\s;|&]*\/(?:idemctl|idempotency-sidecar))(?=[\s;|&]|$)/g)) {
            if (!dockerfile.includes(m[1])) report.error(`${at}: ${kind} runs ${m[1]}, which deploy/docker/Dockerfile does not install`);
          }
        }
        execProbes.push({ at, kind, command: p.exec.command, listen: srv.s.listen });
      }
    }
  }
  if (served && report.errors === before) report.ok(`gRPC probe service names are served by the sidecar (${[...served].map((x) => `"${x}"`).join(', ')})`);
  if (!execProbes.length) return;
  // Phase 1: SERVING (memory store): every probe passes.
  // Phase 2: NOT_SERVING (PostgreSQL unreachable): readiness fails, the
  //          startup and liveness probes pass (no restart while PostgreSQL is down).
  // Phase 3: no sidecar: every probe fails.
  const expectations = [
    { name: 'SERVING', args: ['--store=memory'], pass: () => true },
    { name: 'NOT_SERVING (PostgreSQL unreachable)', args: null, pass: (k) => k !== 'readinessProbe' },
    { name: 'no sidecar', args: undefined, pass: () => false },
  ];
  const beforeRuns = report.errors;
  for (const phase of expectations) {
    const addrPort = await freePort();
    const addr = `127.0.0.1:${addrPort}`;
    let proc = null;
    if (phase.args !== undefined) {
      let args = phase.args;
      if (args === null) {
        const deadPort = await freePort();
        args = [`--postgres=postgresql://idem@127.0.0.1:${deadPort}/idem?connect_timeout=2`, '--pg-connect-timeout=2s'];
      }
      try {
        proc = await startSidecar(sidecar, [...args, `--listen=${addr}`, '--metrics-listen=127.0.0.1:0']);
      } catch (e) {
        report.error(`cannot start the sidecar for the probe test (${phase.name}): ${e.message}`);
        continue;
      }
      if (phase.args === null) {
        // Wait (up to 10 s) until the sidecar reports PostgreSQL down.
        for (let i = 0; i < 50; i++) {
          const r = run(idemctl, [`--addr=${addr}`, '--timeout=2s', '--json', 'health'], { env: cleanEnv() });
          let serving = true;
          try { serving = JSON.parse(r.stdout).serving; } catch (e) { /* not answering yet */ }
          if (serving === false) break;
          await new Promise((res) => setTimeout(res, 200));
        }
      }
    }
    try {
      for (const p of execProbes) {
        const status = runExecProbe(p.command, p.listen, addr, idemctl);
        const want = phase.pass(p.kind);
        if ((status === 0) !== want) {
          report.error(`${p.at}: ${p.kind} exits ${status} with the sidecar ${phase.name}; expected it to ${want ? 'pass' : 'fail'}`);
        }
      }
    } finally {
      if (proc) await stopSidecar(proc);
    }
  }
  if (report.errors === beforeRuns) report.ok(`${execProbes.length} exec probes behave as documented with the sidecar SERVING, NOT_SERVING and gone`);
}

// ---- main
function makeReport(label, sink) {
  const r = { errors: 0, label };
  r.ok = (msg) => sink(`ok    [${label}] ${msg}`);
  r.note = (msg) => sink(`note  [${label}] ${msg}`);
  r.error = (msg) => { r.errors++; sink(`ERROR [${label}] ${msg}`); };
  return r;
}

// Validates one layout directory; prints through `sink`; returns the number
// of errors.
async function validateLayout(dir, opts, sink = console.log) {
  const label = path.basename(dir);
  const report = makeReport(label, sink);
  let objects;
  try {
    objects = render(dir);
  } catch (e) {
    if (e instanceof RenderError || e.code === 'ENOENT') {
      report.error(`cannot render: ${e.message}`);
      return report.errors;
    }
    throw e;
  }
  const examples = [];
  for (const f of fs.readdirSync(dir).filter((x) => x.endsWith('.example.yaml')).sort()) {
    try {
      for (const obj of loadYamlDocs(path.join(dir, f))) {
        Object.defineProperty(obj, '__source', { value: f, enumerable: false });
        examples.push(obj);
      }
    } catch (e) {
      report.error(e.message);
    }
  }
  for (const obj of [...objects, ...examples]) {
    const errs = schemaErrors(obj);
    const where = `${obj.kind} ${obj.metadata && obj.metadata.namespace ? `${obj.metadata.namespace}/` : ''}${obj.metadata && obj.metadata.name} (${obj.__source})`;
    if (errs.length) errs.forEach((e) => report.error(`${where}: ${e}`));
    else report.ok(`${where}: valid ${obj.apiVersion} ${obj.kind}`);
  }
  const policy = checkLayout(objects, examples);
  policy.errors.forEach((e) => report.error(`policy: ${e}`));
  if (!policy.errors.length) report.ok(`policies pass (${objects.length} objects, ${policy.servers.length} serving sidecar container(s))`);

  if (opts.kubectl && which('kubectl')) kubectlCheck(dir, objects, report);
  else if (opts.kubectl) report.note('kubectl not installed: renderer not cross-checked with kubectl kustomize');

  if (opts.sidecar) {
    try {
      checkFlagsAgainstHelp(objects, opts.sidecar, report);
      await checkConfigs(objects, policy.configs, opts.sidecar, report);
      if (opts.idemctl) await checkProbes(objects, policy.servers, opts.sidecar, opts.idemctl, report);
    } catch (e) {
      report.error(`binary checks: ${e.message}`);
    }
  }
  return report.errors;
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`validate.js: ${e.message}`);
    return 2;
  }
  if (opts.help) {
    // The header comment, up to the first line that is not a comment.
    const lines = fs.readFileSync(__filename, 'utf8').split('\n').slice(2);
    const end = lines.findIndex((l) => !l.startsWith('//'));
    console.log(lines.slice(0, end).map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
    return 0;
  }
  for (const bin of [opts.sidecar, opts.idemctl].filter(Boolean)) {
    if (!fs.existsSync(bin)) {
      console.error(`validate.js: ${bin} does not exist (build it first)`);
      return 2;
    }
  }
  let errors = 0;
  for (const dir of opts.layouts) errors += await validateLayout(dir, opts);
  if (errors) {
    console.log(`deploy/k8s/validate: ${errors} error(s) in ${opts.layouts.length} layout(s)`);
    return 1;
  }
  console.log(`deploy/k8s/validate: ${opts.layouts.length} layout(s) valid`);
  return 0;
}

if (require.main === module) {
  main().then((code) => { process.exitCode = code; }, (e) => { console.error(e); process.exitCode = 1; });
}

module.exports = { validateLayout, schemaErrors };
