'use strict';
// The project's deployment policies, checked on the rendered objects of one
// layout (plus its *.example.yaml objects, for references). Each check
// returns messages; an empty list means the layout passes.

const { podSpecs, allContainers, parseImage } = require('./render');

const SIDECAR_IMAGE = /(^|\/)idempotency-sidecar$/;
const READINESS_SERVICE = 'idempotency.v1.Idempotency';
// SERVING while the process lives, whatever PostgreSQL's state.
const LIVENESS_SERVICE = 'liveness';
const LONG_RUNNING = new Set(['Deployment', 'StatefulSet', 'DaemonSet', 'ReplicaSet', 'Pod']);
// Boolean flags of the sidecar; every other flag must be written --flag=value.
const BOOLEAN_FLAGS = new Set(['--insecure', '--migrate', '--help']);
const DEFAULTS = {
  listen: '127.0.0.1:50051',
  metricsListen: '127.0.0.1:9464',
  gracePeriod: '10s',
  drainDelay: '0s',
};

function id(obj) {
  const ns = obj.metadata && obj.metadata.namespace ? `${obj.metadata.namespace}/` : '';
  return `${obj.kind} ${ns}${obj.metadata && obj.metadata.name}`;
}

function isSidecarImage(image) {
  return typeof image === 'string' && SIDECAR_IMAGE.test(parseImage(image).name);
}

// Same rule as the sidecar's IsLoopback (server/main/sidecar_main.cc).
function isLoopback(listen) {
  if (listen.startsWith('unix:')) return true;
  const host = listen.slice(0, listen.lastIndexOf(':'));
  return host.startsWith('127.') || host === 'localhost' || host === '[::1]';
}

function portOf(listen) {
  const p = Number(listen.slice(listen.lastIndexOf(':') + 1));
  return Number.isInteger(p) && p > 0 ? p : null;
}

// Go/absl-style duration ("1m30s", "500ms", "10s") in seconds, or null.
function seconds(text) {
  if (typeof text !== 'string') return null;
  const units = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6, ns: 1e-9 };
  let total = 0;
  let rest = text.trim();
  if (rest === '0') return 0;
  if (!rest) return null;
  while (rest) {
    const m = rest.match(/^(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)/);
    if (!m) return null;
    total += Number(m[1]) * units[m[2]];
    rest = rest.slice(m[0].length);
  }
  return total;
}

// The sidecar's settings as its flag parser sees them: a --flag on the
// command line wins over its IDEM_* environment twin.
function sidecarSettings(c) {
  const args = [...(c.command || []).slice(1), ...(c.args || [])];
  const flags = new Map();
  const problems = [];
  let subcommand = null;
  for (const a of args) {
    if (typeof a !== 'string') continue;
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = eq >= 0 ? a.slice(0, eq) : a;
      if (eq < 0 && !BOOLEAN_FLAGS.has(name)) {
        problems.push(`args: write ${name}=VALUE (one argument), so the value cannot be taken for a subcommand`);
      }
      flags.set(name, eq >= 0 ? a.slice(eq + 1) : 'true');
    } else if (subcommand === null) {
      subcommand = a;
    }
  }
  const env = new Map((c.env || []).map((e) => [e.name, e]));
  const get = (flag, envName, dflt) => {
    if (flags.has(flag)) return flags.get(flag);
    const e = env.get(envName);
    if (e && typeof e.value === 'string') return e.value;
    return dflt;
  };
  const truthy = (v) => ['true', '1', 'yes', 'on'].includes(String(v).toLowerCase());
  return {
    args,
    flags,
    env,
    problems,
    subcommand,
    listen: get('--listen', 'IDEM_LISTEN', DEFAULTS.listen),
    metricsListen: get('--metrics-listen', 'IDEM_METRICS_LISTEN', DEFAULTS.metricsListen),
    insecure: truthy(get('--insecure', 'IDEM_INSECURE', 'false')),
    store: get('--store', 'IDEM_STORE', 'postgres'),
    config: get('--config', 'IDEM_CONFIG', ''),
    gracePeriod: get('--grace-period', 'IDEM_GRACE_PERIOD', DEFAULTS.gracePeriod),
    drainDelay: get('--drain-delay', 'IDEM_DRAIN_DELAY', DEFAULTS.drainDelay),
    httpListen: get('--http-listen', 'IDEM_HTTP_LISTEN', ''),
    httpUpstream: get('--http-upstream', 'IDEM_HTTP_UPSTREAM', ''),
  };
}

// host:port of an http:// URL, or null.
function upstreamAddress(url) {
  const m = /^http:\/\/([^/?#]+)\/?$/.exec(url);
  return m ? m[1] : null;
}

function labelsMatch(selector, labels) {
  if (!selector || !labels) return false;
  const ml = selector.matchLabels || selector;
  if (Object.keys(ml).length === 0 && !selector.matchExpressions) return true;
  for (const [k, v] of Object.entries(ml)) {
    if (k === 'matchExpressions') continue;
    if (labels[k] !== v) return false;
  }
  for (const e of selector.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    if (e.operator === 'In' && !(has && e.values.includes(labels[e.key]))) return false;
    if (e.operator === 'NotIn' && has && e.values.includes(labels[e.key])) return false;
    if (e.operator === 'Exists' && !has) return false;
    if (e.operator === 'DoesNotExist' && has) return false;
  }
  return true;
}

function podTemplateOf(obj) {
  if (obj.kind === 'Pod') return { metadata: obj.metadata || {}, spec: obj.spec || {} };
  if (obj.spec && obj.spec.template) return obj.spec.template;
  if (obj.spec && obj.spec.jobTemplate && obj.spec.jobTemplate.spec) return obj.spec.jobTemplate.spec.template;
  return null;
}

function effective(podSec, cSec, field) {
  if (cSec && cSec[field] !== undefined) return cSec[field];
  return podSec ? podSec[field] : undefined;
}

// ---- checks on every container of every pod
function checkContainer(where, c, podSpec, longRunning, errors) {
  const ps = podSpec.securityContext || {};
  const cs = c.securityContext || {};
  const at = `${where} container ${c.name}`;
  if (effective(ps, cs, 'runAsNonRoot') !== true) errors.push(`${at}: securityContext.runAsNonRoot must be true`);
  if (effective(ps, cs, 'runAsUser') === 0) errors.push(`${at}: runAsUser must not be 0`);
  if (cs.readOnlyRootFilesystem !== true) errors.push(`${at}: securityContext.readOnlyRootFilesystem must be true`);
  if (cs.allowPrivilegeEscalation !== false) errors.push(`${at}: securityContext.allowPrivilegeEscalation must be false`);
  if (cs.privileged === true) errors.push(`${at}: securityContext.privileged must not be true`);
  const caps = cs.capabilities || {};
  if (!(caps.drop || []).includes('ALL')) errors.push(`${at}: securityContext.capabilities.drop must contain ALL`);
  if ((caps.add || []).length) errors.push(`${at}: securityContext.capabilities.add must be empty`);
  const seccomp = effective(ps, cs, 'seccompProfile');
  if (!seccomp || seccomp.type !== 'RuntimeDefault') {
    errors.push(`${at}: seccompProfile.type must be RuntimeDefault (pod or container securityContext)`);
  }
  const r = c.resources || {};
  for (const kind of ['requests', 'limits']) {
    for (const res of ['cpu', 'memory']) {
      if (!r[kind] || r[kind][res] === undefined) errors.push(`${at}: resources.${kind}.${res} must be set`);
    }
  }
  if (typeof c.image !== 'string' || !c.image) {
    errors.push(`${at}: no image`);
  } else {
    const img = parseImage(c.image);
    if (!img.tag && !img.digest) errors.push(`${at}: image ${c.image} has no tag or digest (an untagged image means :latest)`);
    if (img.tag === 'latest') errors.push(`${at}: image ${c.image} uses the tag latest`);
  }
  if (longRunning) {
    if (!c.readinessProbe) errors.push(`${at}: readinessProbe missing`);
    if (!c.livenessProbe) errors.push(`${at}: livenessProbe missing`);
  }
}

// ---- the sidecar's own rules
function checkSidecarProbe(at, kind, probe, s, errors) {
  if (!probe) return; // reported as missing by checkContainer
  const port = portOf(s.listen);
  if (isLoopback(s.listen)) {
    if (probe.grpc || probe.httpGet || probe.tcpSocket) {
      errors.push(`${at}: ${kind} probes the pod IP, but the sidecar listens on ${s.listen} (loopback): ` +
        'kubelet gRPC/TCP/HTTP probes never reach it; use an exec probe running idemctl health');
      return;
    }
    const cmd = (probe.exec && probe.exec.command) || [];
    const line = cmd.join(' ');
    if (!/(^|[\s/])idemctl\s/.test(line) || !/\shealth(\s|$)/.test(line)) {
      errors.push(`${at}: ${kind} must run idemctl ... health (exec), got: ${line || 'no exec command'}`);
    } else if (!line.includes(`--addr=${s.listen}`)) {
      errors.push(`${at}: ${kind} must pass --addr=${s.listen} to idemctl (the sidecar's listen address)`);
    }
    return;
  }
  if (!probe.grpc) {
    errors.push(`${at}: ${kind} must be a gRPC probe (grpc.health.v1), got ${Object.keys(probe).filter((k) => !/Seconds|Threshold/.test(k)).join(', ')}`);
    return;
  }
  if (probe.grpc.port !== port) errors.push(`${at}: ${kind} grpc.port ${probe.grpc.port} is not the listen port ${port}`);
  const service = probe.grpc.service === undefined ? '' : probe.grpc.service;
  const want = kind === 'readinessProbe' ? READINESS_SERVICE : LIVENESS_SERVICE;
  if (service !== want) errors.push(`${at}: ${kind} grpc.service must be "${want}", got "${service}"`);
}

function checkSidecar(where, obj, tpl, c, isInit, layout, errors) {
  const at = `${where} container ${c.name}`;
  const s = sidecarSettings(c);
  for (const p of s.problems) errors.push(`${at}: ${p}`);
  const podSpec = tpl.spec;
  const pg = s.env.get('IDEM_POSTGRES');
  if (s.flags.has('--postgres')) errors.push(`${at}: --postgres on the command line exposes the DSN; use IDEM_POSTGRES from a Secret`);
  if (!pg || !pg.valueFrom || !pg.valueFrom.secretKeyRef) {
    errors.push(`${at}: IDEM_POSTGRES must come from a Secret (valueFrom.secretKeyRef)`);
  }
  if (s.subcommand === 'migrate') {
    layout.migrations.push(`${where}`);
    if (obj.kind !== 'Job') errors.push(`${at}: migrate belongs in a Job`);
    return;
  }
  if (s.subcommand !== null) errors.push(`${at}: unknown subcommand ${s.subcommand}`);
  layout.servers.push({ where, obj, tpl, c, s });
  if (s.store !== 'postgres') errors.push(`${at}: --store=${s.store} is not durable; deployments use postgres`);
  if (!LONG_RUNNING.has(obj.kind)) errors.push(`${at}: a serving sidecar belongs in a Deployment (or a Pod), not a ${obj.kind}`);
  const port = portOf(s.listen);
  if (!isLoopback(s.listen)) {
    if (!s.insecure) {
      errors.push(`${at}: listens on ${s.listen} without --auth-tokens: the sidecar refuses to start without --insecure`);
    }
    if (!(c.ports || []).some((p) => p.containerPort === port)) errors.push(`${at}: containerPort ${port} (gRPC) not declared`);
  }
  checkSidecarProbe(at, 'readinessProbe', c.readinessProbe, s, errors);
  checkSidecarProbe(at, 'livenessProbe', c.livenessProbe, s, errors);
  if (c.startupProbe) checkSidecarProbe(at, 'startupProbe', c.startupProbe, s, errors);

  // Native sidecar next to a business container.
  if (isInit) {
    if (c.restartPolicy !== 'Always') {
      errors.push(`${at}: an init container sidecar needs restartPolicy: Always (a native sidecar); otherwise the pod never starts`);
    }
  } else if ((podSpec.containers || []).length > 1) {
    errors.push(`${at}: run the sidecar as a native sidecar (initContainers with restartPolicy: Always) so it starts before and stops after the business container`);
  }

  // Graceful shutdown.
  const grace = seconds(s.gracePeriod);
  const drain = seconds(s.drainDelay);
  if (grace === null) errors.push(`${at}: bad --grace-period ${s.gracePeriod}`);
  if (drain === null) errors.push(`${at}: bad --drain-delay ${s.drainDelay}`);
  const tgps = podSpec.terminationGracePeriodSeconds === undefined ? 30 : podSpec.terminationGracePeriodSeconds;
  if (grace !== null && drain !== null && !(tgps > grace + drain)) {
    errors.push(`${where}: terminationGracePeriodSeconds ${tgps} must exceed the sidecar's drain delay + grace period (${drain}s + ${grace}s)`);
  }

  // Prometheus scraping.
  const ann = (tpl.metadata && tpl.metadata.annotations) || {};
  const mport = portOf(s.metricsListen);
  if (ann['prometheus.io/scrape'] !== 'true') errors.push(`${where}: pod annotation prometheus.io/scrape: "true" missing`);
  if (ann['prometheus.io/port'] !== String(mport)) {
    errors.push(`${where}: pod annotation prometheus.io/port must be "${mport}" (the metrics port), got ${JSON.stringify(ann['prometheus.io/port'])}`);
  }
  if (isLoopback(s.metricsListen)) {
    errors.push(`${at}: metrics listen on ${s.metricsListen} (loopback): Prometheus cannot scrape it; set IDEM_METRICS_LISTEN=0.0.0.0:${mport}`);
  }
  if (!(c.ports || []).some((p) => p.containerPort === mport)) errors.push(`${at}: containerPort ${mport} (metrics) not declared`);

  if (s.httpListen) checkGateway(at, obj, c, tpl, s, layout, errors);

  // The --config file is mounted from a ConfigMap of this layout.
  if (s.config) {
    const mount = (c.volumeMounts || []).find((m) => s.config.startsWith(m.mountPath.replace(/\/?$/, '/')));
    if (!mount) {
      errors.push(`${at}: --config ${s.config} is not under any volumeMount`);
    } else {
      const vol = (podSpec.volumes || []).find((v) => v.name === mount.name);
      if (!vol || !vol.configMap) {
        errors.push(`${at}: --config ${s.config} is mounted from volume ${mount.name}, which is not a ConfigMap`);
      } else {
        layout.configs.push({
          at, configMap: vol.configMap.name, namespace: obj.metadata.namespace,
          key: s.config.slice(mount.mountPath.replace(/\/?$/, '/').length),
          httpUpstream: s.httpListen ? s.httpUpstream : '',
        });
      }
    }
  }
  if (podSpec.automountServiceAccountToken !== false) {
    errors.push(`${where}: automountServiceAccountToken must be false (the sidecar never calls the Kubernetes API)`);
  }
}

// ---- the HTTP gateway (docs/gateway.md): the pod's entry, in front of an
// application on the pod's loopback
function checkGateway(at, obj, c, tpl, s, layout, errors) {
  const port = portOf(s.httpListen);
  const upstream = upstreamAddress(s.httpUpstream);
  if (!s.httpUpstream) {
    errors.push(`${at}: --http-listen needs --http-upstream (the application behind the gateway)`);
  } else if (!upstream) {
    errors.push(`${at}: --http-upstream ${s.httpUpstream} is not http://HOST:PORT`);
  } else if (!isLoopback(upstream)) {
    errors.push(`${at}: --http-upstream ${s.httpUpstream} is not on the pod's loopback: ` +
      'the application must listen on 127.0.0.1 so that no request goes around the gateway');
  }
  if (isLoopback(s.httpListen)) {
    errors.push(`${at}: --http-listen ${s.httpListen} is loopback: the gateway is the pod's entry; listen on 0.0.0.0`);
  } else if (!(c.ports || []).some((p) => p.containerPort === port)) {
    errors.push(`${at}: containerPort ${port} (HTTP gateway) not declared`);
  }
  layout.gateways.push({ at, obj, tpl, port, upstreamPort: upstream ? portOf(upstream) : null });
}

// The port number a Service's targetPort or a probe's port names in `containers`.
function resolvePort(port, containers) {
  if (typeof port === 'number') return port;
  for (const c of containers) {
    const p = (c.ports || []).find((x) => x.name === port);
    if (p) return p.containerPort;
  }
  return null;
}

// A gateway pod is reached through the gateway only: a Service targets its
// port, and nothing (Service or kubelet probe) dials the application's port,
// which listens on loopback.
function checkGatewayPods(objects, layout, errors) {
  for (const g of layout.gateways) {
    const ns = g.obj.metadata.namespace || '';
    const labels = (g.tpl.metadata && g.tpl.metadata.labels) || {};
    const containers = allContainers(g.tpl.spec);
    let entry = false;
    for (const svc of objects.filter((o) => o.kind === 'Service' && (o.metadata.namespace || '') === ns)) {
      if (!labelsMatch(svc.spec.selector || {}, labels)) continue;
      for (const sp of svc.spec.ports || []) {
        const target = resolvePort(sp.targetPort === undefined ? sp.port : sp.targetPort, containers);
        if (target === g.port) entry = true;
        if (g.upstreamPort !== null && target === g.upstreamPort) {
          errors.push(`${id(svc)}: port ${sp.name || sp.port} targets the application's port ${target} ` +
            `around the gateway of ${id(g.obj)}; target the gateway's port ${g.port}`);
        }
      }
    }
    if (!entry) errors.push(`${g.at}: no Service targets the gateway's port ${g.port}: the gateway is the pod's entry`);
    if (g.upstreamPort === null) continue;
    for (const c of containers) {
      for (const kind of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
        const p = c[kind] || {};
        const action = p.httpGet || p.tcpSocket || p.grpc;
        if (action && resolvePort(action.port, [c]) === g.upstreamPort) {
          errors.push(`${id(g.obj)} container ${c.name}: ${kind} dials the pod IP on port ${g.upstreamPort}, ` +
            `but the application listens on loopback there: kubelet probes never reach it; probe through the gateway's port ${g.port}`);
        }
      }
    }
  }
}

// ---- references between objects
function checkReferences(objects, examples, errors) {
  const all = [...objects, ...examples];
  const find = (kind, ns, name) => all.find((o) => o.kind === kind && o.metadata.name === name && (o.metadata.namespace || '') === (ns || ''));
  const keysOf = (o) => new Set([...Object.keys(o.data || {}), ...Object.keys(o.stringData || {}), ...Object.keys(o.binaryData || {})]);
  for (const obj of objects) {
    const ns = obj.metadata.namespace;
    for (const spec of podSpecs(obj)) {
      const ref = (kind, name, key, optional, what) => {
        const target = find(kind, ns, name);
        if (!target) {
          if (!optional) errors.push(`${id(obj)}: ${what} refers to ${kind} ${ns}/${name}, which is neither rendered nor in an *.example.yaml`);
          return;
        }
        if (key !== undefined && !keysOf(target).has(key) && !optional) {
          errors.push(`${id(obj)}: ${what} refers to key ${key} of ${kind} ${ns}/${name}, which has no such key`);
        }
      };
      if (spec.serviceAccountName && !find('ServiceAccount', ns, spec.serviceAccountName)) {
        errors.push(`${id(obj)}: serviceAccountName ${spec.serviceAccountName} is not rendered`);
      }
      const volumeNames = new Set((spec.volumes || []).map((v) => v.name));
      for (const v of spec.volumes || []) {
        if (v.configMap) ref('ConfigMap', v.configMap.name, undefined, v.configMap.optional, `volume ${v.name}`);
        if (v.secret) ref('Secret', v.secret.secretName, undefined, v.secret.optional, `volume ${v.name}`);
      }
      for (const c of allContainers(spec)) {
        for (const e of c.env || []) {
          const vf = e.valueFrom || {};
          if (vf.secretKeyRef) ref('Secret', vf.secretKeyRef.name, vf.secretKeyRef.key, vf.secretKeyRef.optional, `env ${e.name} of ${c.name}`);
          if (vf.configMapKeyRef) ref('ConfigMap', vf.configMapKeyRef.name, vf.configMapKeyRef.key, vf.configMapKeyRef.optional, `env ${e.name} of ${c.name}`);
        }
        for (const e of c.envFrom || []) {
          if (e.secretRef) ref('Secret', e.secretRef.name, undefined, e.secretRef.optional, `envFrom of ${c.name}`);
          if (e.configMapRef) ref('ConfigMap', e.configMapRef.name, undefined, e.configMapRef.optional, `envFrom of ${c.name}`);
        }
        for (const m of c.volumeMounts || []) {
          if (!volumeNames.has(m.name)) errors.push(`${id(obj)}: container ${c.name} mounts volume ${m.name}, which the pod does not have`);
        }
        for (const e of c.env || []) {
          if (typeof e.value === 'string' && /(password|secret|token|dsn)/i.test(e.name)) {
            errors.push(`${id(obj)}: env ${e.name} of ${c.name} has a literal value; take it from a Secret`);
          }
        }
      }
    }
    if (obj.kind === 'Deployment' || obj.kind === 'StatefulSet' || obj.kind === 'DaemonSet' || obj.kind === 'ReplicaSet' || obj.kind === 'Job') {
      const tpl = podTemplateOf(obj);
      const sel = obj.spec.selector;
      if (obj.kind !== 'Job' && !labelsMatch(sel, tpl && tpl.metadata && tpl.metadata.labels)) {
        errors.push(`${id(obj)}: spec.selector does not match the pod template's labels`);
      }
    }
  }
}

// Service, PodDisruptionBudget and NetworkPolicy select the right pods.
function checkSelectors(objects, layout, errors) {
  const pods = objects.map((o) => ({ o, tpl: podTemplateOf(o) })).filter((p) => p.tpl);
  const selected = (ns, sel) => pods.filter((p) => (p.o.metadata.namespace || '') === (ns || '') && labelsMatch(sel, p.tpl.metadata && p.tpl.metadata.labels));
  for (const svc of objects.filter((o) => o.kind === 'Service')) {
    const hits = selected(svc.metadata.namespace, svc.spec.selector || {});
    if (!hits.length) errors.push(`${id(svc)}: selector matches no pod template`);
    for (const h of hits) {
      if (h.o.kind === 'Job' || h.o.kind === 'CronJob') errors.push(`${id(svc)}: selector also matches the pods of ${id(h.o)}`);
    }
    for (const port of svc.spec.ports || []) {
      const tp = port.targetPort === undefined ? port.port : port.targetPort;
      for (const h of hits.filter((x) => x.o.kind !== 'Job')) {
        const ok = allContainers(h.tpl.spec).some((c) => (c.ports || []).some((p) => p.name === tp || p.containerPort === tp));
        if (!ok) errors.push(`${id(svc)}: port ${port.name || port.port} targets ${tp}, which no container of ${id(h.o)} declares`);
      }
    }
  }
  for (const pdb of objects.filter((o) => o.kind === 'PodDisruptionBudget')) {
    const hits = selected(pdb.metadata.namespace, pdb.spec.selector || {});
    if (!hits.length) errors.push(`${id(pdb)}: selector matches no pod template`);
    for (const h of hits) {
      if (h.o.kind === 'Job') errors.push(`${id(pdb)}: selector also matches the pods of ${id(h.o)}`);
    }
  }
  // A shared (network-facing) sidecar with replicas has a PDB and a
  // NetworkPolicy that lets clients, Prometheus, PostgreSQL and DNS through.
  for (const srv of layout.servers) {
    if (isLoopback(srv.s.listen)) continue;
    const labels = (srv.tpl.metadata && srv.tpl.metadata.labels) || {};
    const ns = srv.obj.metadata.namespace || '';
    const at = id(srv.obj);
    if ((srv.obj.spec.replicas || 1) > 1 && !objects.some((o) => o.kind === 'PodDisruptionBudget' && (o.metadata.namespace || '') === ns && labelsMatch(o.spec.selector, labels))) {
      errors.push(`${at}: no PodDisruptionBudget selects its pods`);
    }
    const nps = objects.filter((o) => o.kind === 'NetworkPolicy' && (o.metadata.namespace || '') === ns && labelsMatch(o.spec.podSelector || {}, labels));
    if (!nps.length) {
      errors.push(`${at}: listens on ${srv.s.listen} without TLS, and no NetworkPolicy selects its pods`);
      continue;
    }
    const ingressPorts = new Set();
    const egressPorts = new Set();
    let ingressFromAnywhere = false;
    for (const np of nps) {
      for (const rule of np.spec.ingress || []) {
        if (!rule.from || !rule.from.length) ingressFromAnywhere = true;
        for (const p of rule.ports || []) ingressPorts.add(p.port);
        if (!rule.ports) ingressPorts.add('*');
      }
      for (const rule of np.spec.egress || []) {
        for (const p of rule.ports || []) egressPorts.add(`${p.port}/${p.protocol || 'TCP'}`);
      }
      const types = np.spec.policyTypes || ['Ingress'];
      if (!types.includes('Ingress') || !types.includes('Egress')) {
        errors.push(`${id(np)}: policyTypes must include Ingress and Egress`);
      }
    }
    if (ingressFromAnywhere) errors.push(`${at}: a NetworkPolicy ingress rule has no "from": plaintext gRPC would be open to every pod`);
    if (ingressPorts.has('*')) errors.push(`${at}: a NetworkPolicy ingress rule has no "ports"`);
    const grpcPort = portOf(srv.s.listen);
    const metricsPort = portOf(srv.s.metricsListen);
    if (!ingressPorts.has(grpcPort)) errors.push(`${at}: no NetworkPolicy ingress rule admits gRPC port ${grpcPort}`);
    if (!ingressPorts.has(metricsPort)) errors.push(`${at}: no NetworkPolicy ingress rule admits metrics port ${metricsPort}`);
    for (const need of ['53/UDP', '5432/TCP']) {
      if (!egressPorts.has(need)) errors.push(`${at}: no NetworkPolicy egress rule admits ${need}`);
    }
    if (srv.s.env.has('IDEM_REDIS') && !egressPorts.has('6379/TCP')) errors.push(`${at}: IDEM_REDIS is set but no NetworkPolicy egress rule admits 6379/TCP`);
  }
}

// Runs every policy check on one rendered layout. Returns
// {errors, servers, configs} (the last two for the binary checks).
function checkLayout(objects, examples) {
  const errors = [];
  const layout = { servers: [], migrations: [], configs: [], gateways: [] };
  for (const obj of objects) {
    const tpl = podTemplateOf(obj);
    if (!tpl || !tpl.spec) continue;
    const where = id(obj);
    const spec = tpl.spec;
    const ps = spec.securityContext || {};
    if (ps.runAsNonRoot !== true) errors.push(`${where}: pod securityContext.runAsNonRoot must be true`);
    for (const f of ['hostNetwork', 'hostPID', 'hostIPC']) {
      if (spec[f] === true) errors.push(`${where}: ${f} must not be true`);
    }
    const longRunning = LONG_RUNNING.has(obj.kind);
    for (const c of spec.initContainers || []) {
      const native = c.restartPolicy === 'Always';
      checkContainer(where, c, spec, longRunning && native, errors);
      if (isSidecarImage(c.image)) checkSidecar(where, obj, tpl, c, true, layout, errors);
    }
    for (const c of spec.containers || []) {
      checkContainer(where, c, spec, longRunning, errors);
      if (isSidecarImage(c.image)) checkSidecar(where, obj, tpl, c, false, layout, errors);
    }
  }
  if (layout.servers.length && !layout.migrations.length) {
    errors.push('the layout runs the sidecar but has no migration Job (args: [migrate])');
  }
  checkReferences(objects, examples, errors);
  checkSelectors(objects, layout, errors);
  checkGatewayPods(objects, layout, errors);
  return { errors, servers: layout.servers, configs: layout.configs };
}

module.exports = { checkLayout, sidecarSettings, isSidecarImage, isLoopback, seconds, id };
