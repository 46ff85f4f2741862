#!/usr/bin/env node
'use strict';
// Proves that validate.js rejects broken manifests: each case copies a layout
// to a temporary directory, breaks one thing in it, and expects validation
// to fail with a message naming the problem. A case whose text is no longer
// in the manifests fails too, so the cases follow the manifests.
//
// usage: node selftest.js     exit 0 when every case is rejected as expected

const fs = require('fs');
const os = require('os');
const path = require('path');
const { validateLayout } = require('./validate');

const K8S = path.resolve(__dirname, '..');

const CASES = [
  // Schema and unknown fields.
  { layout: 'shared', file: 'deployment.yaml', name: 'misspelt field',
    from: 'readOnlyRootFilesystem: true', to: 'readOnlyRootFilesytem: true',
    expect: 'unknown field "readOnlyRootFilesytem"' },
  { layout: 'shared', file: 'deployment.yaml', name: 'wrong type',
    from: 'replicas: 3', to: 'replicas: "3"', expect: 'spec.replicas: must be integer' },
  { layout: 'shared', file: 'networkpolicy.yaml', name: 'bad enum',
    from: '- Egress', to: '- Outbound', expect: 'policyTypes' },
  { layout: 'shared', file: 'secret.example.yaml', name: 'example Secret with a misspelt field',
    from: 'stringData:', to: 'stringdata:', expect: 'unknown field "stringdata"' },
  // Renderer.
  { layout: 'shared', file: 'kustomization.yaml', name: 'unsupported kustomize field',
    from: 'namespace: idempotency', to: 'namespace: idempotency\ncommonLabels:\n  a: b',
    expect: 'field "commonLabels" is not supported' },
  { layout: 'shared', file: 'kustomization.yaml', name: 'missing resource file',
    from: '- service.yaml', to: '- services.yaml', expect: 'services.yaml is not a file' },
  // Security context, resources, images.
  { layout: 'shared', file: 'deployment.yaml', name: 'readOnlyRootFilesystem removed',
    from: '            readOnlyRootFilesystem: true\n', to: '',
    expect: 'readOnlyRootFilesystem must be true' },
  { layout: 'shared', file: 'migrate-job.yaml', name: 'privilege escalation',
    from: 'allowPrivilegeEscalation: false', to: 'allowPrivilegeEscalation: true',
    expect: 'allowPrivilegeEscalation must be false' },
  { layout: 'shared', file: 'deployment.yaml', name: 'capabilities not dropped',
    from: '                - ALL', to: '                - NET_RAW', expect: 'capabilities.drop must contain ALL' },
  { layout: 'shared', file: 'deployment.yaml', name: 'no seccomp profile (pod and container)',
    edits: [
      ['        seccompProfile:\n          type: RuntimeDefault\n      topology', '      topology'],
      ['            seccompProfile:\n              type: RuntimeDefault\n          volumeMounts', '          volumeMounts'],
    ],
    expect: 'seccompProfile.type must be RuntimeDefault' },
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'root user',
    from: 'runAsUser: 65532', to: 'runAsUser: 0', expect: 'runAsUser must not be 0' },
  { layout: 'shared', file: 'deployment.yaml', name: 'memory limit removed',
    from: '              memory: 256Mi\n', to: '', expect: 'resources.limits.memory must be set' },
  { layout: 'shared', file: 'kustomization.yaml', name: 'latest image',
    from: 'newTag: "0.1.0"', to: 'newTag: latest', expect: 'uses the tag latest' },
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'untagged business image',
    from: 'image: registry.example.com/shop/orders:1.4.2', to: 'image: registry.example.com/shop/orders',
    expect: 'has no tag or digest' },
  // Probes.
  { layout: 'shared', file: 'deployment.yaml', name: 'readiness on a misspelt service',
    from: 'service: idempotency.v1.Idempotency', to: 'service: idempotency.v1.Idempotancy',
    expect: 'grpc.service must be "idempotency.v1.Idempotency"' },
  { layout: 'shared', file: 'deployment.yaml', name: 'HTTP liveness probe',
    from: '          livenessProbe:\n            grpc:\n              port: 50051\n              service: liveness',
    to: '          livenessProbe:\n            httpGet:\n              port: 50051',
    expect: 'livenessProbe must be a gRPC probe' },
  { layout: 'shared', file: 'deployment.yaml', name: 'readiness probe removed',
    from: '          readinessProbe:\n', to: '          x-readinessProbe:\n', expect: 'readinessProbe missing' },
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'gRPC probe on a loopback listener',
    from: '          readinessProbe:\n            exec:\n              command:\n                - /usr/local/bin/idemctl\n                - --addr=127.0.0.1:50051\n                - --timeout=2s\n                - health\n',
    to: '          readinessProbe:\n            grpc:\n              port: 50051\n              service: idempotency.v1.Idempotency\n',
    expect: 'kubelet gRPC/TCP/HTTP probes never reach it' },
  // Sidecar configuration.
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'not a native sidecar',
    from: '          restartPolicy: Always\n', to: '', expect: 'needs restartPolicy: Always' },
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'non-loopback listener without --insecure',
    from: 'value: 127.0.0.1:50051\n            - name: IDEM_METRICS_LISTEN',
    to: 'value: 0.0.0.0:50051\n            - name: IDEM_METRICS_LISTEN',
    expect: 'refuses to start without --insecure' },
  { layout: 'shared', file: 'deployment.yaml', name: '--insecure removed',
    from: '          args:\n            - --insecure\n', to: '', expect: 'refuses to start without --insecure' },
  { layout: 'shared', file: 'deployment.yaml', name: 'grace period too short',
    from: 'terminationGracePeriodSeconds: 30', to: 'terminationGracePeriodSeconds: 12',
    expect: 'terminationGracePeriodSeconds 12 must exceed' },
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'scrape annotation off',
    from: 'prometheus.io/scrape: "true"', to: 'prometheus.io/scrape: "false"',
    expect: 'prometheus.io/scrape: "true" missing' },
  { layout: 'shared', file: 'deployment.yaml', name: 'metrics on loopback',
    from: 'value: 0.0.0.0:9464', to: 'value: 127.0.0.1:9464', expect: 'Prometheus cannot scrape it' },
  { layout: 'shared', file: 'deployment.yaml', name: 'DSN in plain text',
    from: '            - name: IDEM_POSTGRES\n              valueFrom:\n                secretKeyRef:\n                  name: idempotency-sidecar\n                  key: postgres-dsn\n',
    to: '            - name: IDEM_POSTGRES\n              value: postgresql://u:p@db/idem\n',
    expect: 'IDEM_POSTGRES must come from a Secret' },
  { layout: 'shared', file: 'deployment.yaml', name: 'memory store',
    from: '            - --insecure\n', to: '            - --insecure\n            - --store=memory\n',
    expect: '--store=memory is not durable' },
  // References and selectors.
  { layout: 'shared', file: 'deployment.yaml', name: 'Secret key that the example lacks',
    from: 'key: postgres-dsn', to: 'key: postgres-url', expect: 'refers to key postgres-url' },
  { layout: 'pod-sidecar', file: 'deployment.yaml', name: 'ConfigMap that is not generated',
    from: 'name: orders-idempotency-policies', to: 'name: orders-policies',
    expect: 'refers to ConfigMap shop/orders-policies' },
  { layout: 'shared', file: 'service.yaml', name: 'Service selecting the migration Job',
    from: '    app.kubernetes.io/component: server\n  ports:', to: '  ports:',
    expect: 'selector also matches the pods of Job' },
  { layout: 'shared', file: 'poddisruptionbudget.yaml', name: 'PDB selecting nothing',
    from: '    matchLabels:\n      app.kubernetes.io/name: idempotency-sidecar\n      app.kubernetes.io/component: server',
    to: '    matchLabels:\n      app.kubernetes.io/name: idempotency-sidecar\n      app.kubernetes.io/component: serve',
    expect: 'selector matches no pod template' },
  { layout: 'shared', file: 'networkpolicy.yaml', name: 'no PostgreSQL egress',
    from: '    - ports:\n        - port: 5432\n          protocol: TCP\n', to: '',
    expect: 'no NetworkPolicy egress rule admits 5432/TCP' },
  { layout: 'shared', file: 'networkpolicy.yaml', name: 'ingress from every pod',
    from: '    - from:\n        - namespaceSelector: {}\n          podSelector:\n            matchLabels:\n              idempotency-sidecar/client: "true"\n      ports:',
    to: '    - ports:', expect: 'has no "from"' },
  { layout: 'shared', file: 'kustomization.yaml', name: 'migration Job dropped',
    from: '  - migrate-job.yaml\n', to: '', expect: 'has no migration Job' },
  { layout: 'shared', file: 'kustomization.yaml', name: 'PodDisruptionBudget dropped',
    from: '  - poddisruptionbudget.yaml\n', to: '', expect: 'no PodDisruptionBudget selects its pods' },
  // The HTTP gateway as the pod's only entry.
  { layout: 'pod-gateway', file: 'service.yaml', name: 'Service around the gateway',
    from: 'targetPort: 8080', to: 'targetPort: 3000', expect: "targets the application's port 3000 around the gateway" },
  { layout: 'pod-gateway', file: 'kustomization.yaml', name: 'gateway Service dropped',
    from: '  - service.yaml\n', to: '', expect: "no Service targets the gateway's port 8080" },
  { layout: 'pod-gateway', file: 'deployment.yaml', name: 'upstream off the loopback',
    from: '--http-upstream=http://127.0.0.1:3000', to: '--http-upstream=http://orders-app:3000',
    expect: "is not on the pod's loopback" },
  { layout: 'pod-gateway', file: 'deployment.yaml', name: 'gateway on loopback',
    from: '--http-listen=0.0.0.0:8080', to: '--http-listen=127.0.0.1:8080', expect: "is loopback: the gateway is the pod's entry" },
  { layout: 'pod-gateway', file: 'deployment.yaml', name: 'gateway port not declared',
    from: '            - name: http\n              containerPort: 8080\n              protocol: TCP\n', to: '',
    expect: 'containerPort 8080 (HTTP gateway) not declared' },
  { layout: 'pod-gateway', file: 'deployment.yaml', name: 'probe dialling the loopback application',
    from: 'path: /readyz\n              port: 8080', to: 'path: /readyz\n              port: 3000',
    expect: 'the application listens on loopback there' },
];

function copyDir(from, to) {
  fs.mkdirSync(to, { recursive: true });
  for (const entry of fs.readdirSync(from, { withFileTypes: true })) {
    const src = path.join(from, entry.name);
    const dst = path.join(to, entry.name);
    if (entry.isDirectory()) copyDir(src, dst);
    else fs.copyFileSync(src, dst);
  }
}

async function main() {
  let failed = 0;
  for (const c of CASES) {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-k8s-selftest-'));
    const dir = path.join(tmp, c.layout);
    try {
      copyDir(path.join(K8S, c.layout), dir);
      const file = path.join(dir, c.file);
      let text = fs.readFileSync(file, 'utf8');
      const edits = c.edits || [[c.from, c.to]];
      const stale = edits.find(([from]) => !text.includes(from));
      if (stale) {
        failed++;
        console.log(`FAIL  ${c.name}: ${c.layout}/${c.file} no longer contains the text this case breaks; update selftest.js`);
        continue;
      }
      for (const [from, to] of edits) text = text.replace(from, to);
      fs.writeFileSync(file, text);
      const lines = [];
      const errors = await validateLayout(dir, { kubectl: false }, (l) => lines.push(l));
      const hit = lines.find((l) => l.startsWith('ERROR') && l.includes(c.expect));
      if (errors > 0 && hit) {
        console.log(`ok    rejected: ${c.name}\n        ${hit.replace(/^ERROR \[[^\]]*\] /, '')}`);
      } else {
        failed++;
        console.log(`FAIL  ${c.name}: expected an error containing ${JSON.stringify(c.expect)}; got ${errors} error(s):`);
        lines.filter((l) => l.startsWith('ERROR')).forEach((l) => console.log(`        ${l}`));
      }
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  }
  console.log(`deploy/k8s/validate selftest: ${CASES.length - failed} of ${CASES.length} broken copies rejected`);
  return failed ? 1 : 0;
}

main().then((code) => { process.exitCode = code; }, (e) => { console.error(e); process.exitCode = 1; });
