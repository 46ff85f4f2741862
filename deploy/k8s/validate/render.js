'use strict';
// Why this exists: no Debian 12 package can render deploy/k8s/*. Debian 12
// packages no kustomize, and its kubectl (kubernetes-client 1.20.2) embeds
// kustomize v2.0.3, which stops at our `labels` field ("json: unknown field
// \"labels\""); its only alternative, commonLabels, would also rewrite the
// Deployments' selectors, which are immutable. The policy checks need the
// rendered objects, so this renders them, and validate.js compares the
// result with `kubectl kustomize` wherever a newer kubectl (1.21+, from
// outside Debian) is installed. Drop this file for `kubectl kustomize` once
// the distribution the project builds on packages a kubectl that can do it.
//
// A small kustomize renderer: exactly the kustomization fields that
// deploy/k8s/* use, rendered the way kustomize v5 does, and an error for any
// other field (so that a new field is never silently ignored). validate.js
// compares its output with `kubectl kustomize` when kubectl is installed.
//
// Supported:
//   resources          files in the kustomization's directory (YAML, multi-doc)
//   namespace          metadata.namespace of every namespaced object
//   labels             [{pairs}] added to metadata.labels of every object
//                      (includeSelectors and includeTemplates false only)
//   configMapGenerator [{name, files, literals}] with kustomize's content-hash
//                      name suffix; references to the generated ConfigMaps
//                      from pod specs are renamed to match
//   images             [{name, newName, newTag, digest}] on containers and
//                      initContainers

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const yaml = require('js-yaml');

const SUPPORTED = new Set(['apiVersion', 'kind', 'namespace', 'labels', 'resources', 'configMapGenerator', 'images']);

// Kinds that are not namespaced, among those that a kustomization here could
// hold. Any other kind gets the namespace.
const CLUSTER_SCOPED = new Set([
  'Namespace', 'ClusterRole', 'ClusterRoleBinding', 'CustomResourceDefinition',
  'PersistentVolume', 'StorageClass', 'PriorityClass', 'IngressClass', 'RuntimeClass',
  'MutatingWebhookConfiguration', 'ValidatingWebhookConfiguration', 'APIService', 'Node',
]);

class RenderError extends Error {}

function loadYamlDocs(file) {
  const text = fs.readFileSync(file, 'utf8');
  let docs;
  try {
    docs = yaml.loadAll(text, null, { filename: file });
  } catch (e) {
    throw new RenderError(`${file}: ${e.message}`);
  }
  return docs.filter((d) => d !== null && d !== undefined);
}

function insideDir(dir, rel) {
  const full = path.resolve(dir, rel);
  const back = path.relative(dir, full);
  if (back.startsWith('..') || path.isAbsolute(back)) {
    throw new RenderError(`${rel}: outside the kustomization directory ${dir}`);
  }
  return full;
}

// kustomize's ConfigMap name hash (api/hasher): sha256 of the Go
// json.Marshal of {data, kind, name} (keys sorted, HTML characters escaped),
// its first 10 hex digits with 0 1 3 a e replaced to avoid words. kustomize
// v5 hashes the generated object before it has a name (name ""), so equal
// data gives equal suffixes whatever the name, namespace or labels.
function goJson(value) {
  if (value === null || typeof value !== 'object') {
    return JSON.stringify(value)
      .replace(/</g, '\\u003c').replace(/>/g, '\\u003e').replace(/&/g, '\\u0026')
      .replace(/\u2028/g, '\\u2028').replace(/\u2029/g, '\\u2029');
  }
  if (Array.isArray(value)) return `[${value.map(goJson).join(',')}]`;
  const keys = Object.keys(value).sort();
  return `{${keys.map((k) => `${goJson(k)}:${goJson(value[k])}`).join(',')}}`;
}

function configMapHash(cm) {
  const m = { kind: 'ConfigMap', name: '', data: cm.data || {} };
  if (cm.immutable) m.immutable = true;
  if (cm.binaryData && Object.keys(cm.binaryData).length) m.binaryData = cm.binaryData;
  const hex = crypto.createHash('sha256').update(goJson(m)).digest('hex');
  const swap = { 0: 'g', 1: 'h', 3: 'k', a: 'm', e: 't' };
  return [...hex.slice(0, 10)].map((c) => swap[c] || c).join('');
}

function generateConfigMap(dir, gen, where) {
  const allowed = new Set(['name', 'files', 'literals']);
  for (const k of Object.keys(gen)) {
    if (!allowed.has(k)) throw new RenderError(`${where}: configMapGenerator field "${k}" is not supported by this renderer`);
  }
  if (!gen.name) throw new RenderError(`${where}: configMapGenerator entry without name`);
  const data = {};
  for (const entry of gen.files || []) {
    const eq = entry.indexOf('=');
    const key = eq >= 0 ? entry.slice(0, eq) : path.basename(entry);
    const file = insideDir(dir, eq >= 0 ? entry.slice(eq + 1) : entry);
    if (key in data) throw new RenderError(`${where}: configMapGenerator ${gen.name}: duplicate key ${key}`);
    data[key] = fs.readFileSync(file, 'utf8');
  }
  for (const entry of gen.literals || []) {
    const eq = entry.indexOf('=');
    if (eq <= 0) throw new RenderError(`${where}: configMapGenerator ${gen.name}: literal "${entry}" is not KEY=VALUE`);
    data[entry.slice(0, eq)] = entry.slice(eq + 1);
  }
  return { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: gen.name }, data };
}

// Every pod spec in an object: Pod, workload templates, CronJob job templates.
function podSpecs(obj) {
  const specs = [];
  if (!obj || !obj.spec) return specs;
  if (obj.kind === 'Pod') specs.push(obj.spec);
  if (obj.spec.template && obj.spec.template.spec) specs.push(obj.spec.template.spec);
  const jt = obj.spec.jobTemplate;
  if (jt && jt.spec && jt.spec.template && jt.spec.template.spec) specs.push(jt.spec.template.spec);
  return specs;
}

function allContainers(spec) {
  return [...(spec.initContainers || []), ...(spec.containers || []), ...(spec.ephemeralContainers || [])];
}

// name[:tag][@digest] -> {name, tag, digest}
function parseImage(image) {
  let rest = image;
  let digest = null;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
  }
  let tag = null;
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
  }
  return { name: rest, tag, digest };
}

function applyImages(objects, images, where) {
  for (const img of images) {
    for (const k of Object.keys(img)) {
      if (!['name', 'newName', 'newTag', 'digest'].includes(k)) {
        throw new RenderError(`${where}: images field "${k}" is not supported by this renderer`);
      }
    }
    for (const obj of objects) {
      for (const spec of podSpecs(obj)) {
        for (const c of allContainers(spec)) {
          if (typeof c.image !== 'string') continue;
          const cur = parseImage(c.image);
          if (cur.name !== img.name) continue;
          let out = img.newName || cur.name;
          if (img.digest) out += `@${img.digest}`;
          else if (img.newTag !== undefined) out += `:${img.newTag}`;
          else {
            if (cur.tag) out += `:${cur.tag}`;
            if (cur.digest) out += `@${cur.digest}`;
          }
          c.image = out;
        }
      }
    }
  }
}

// Renames references to generated ConfigMaps in pod specs (same namespace).
function renameConfigMapRefs(objects, renames) {
  for (const obj of objects) {
    const ns = obj.metadata && obj.metadata.namespace;
    const rename = (holder) => {
      if (!holder || typeof holder.name !== 'string') return;
      const to = renames.get(`${ns || ''}/${holder.name}`);
      if (to) holder.name = to;
    };
    for (const spec of podSpecs(obj)) {
      for (const v of spec.volumes || []) {
        rename(v.configMap);
        for (const src of (v.projected && v.projected.sources) || []) rename(src.configMap);
      }
      for (const c of allContainers(spec)) {
        for (const e of c.env || []) rename(e.valueFrom && e.valueFrom.configMapKeyRef);
        for (const e of c.envFrom || []) rename(e.configMapRef);
      }
    }
  }
}

// Renders the kustomization in `dir`. Returns the objects, in resource order
// (generated ConfigMaps last).
function render(dir) {
  dir = path.resolve(dir);
  const kfile = ['kustomization.yaml', 'kustomization.yml', 'Kustomization']
    .map((f) => path.join(dir, f)).find((f) => fs.existsSync(f));
  if (!kfile) throw new RenderError(`${dir}: no kustomization.yaml`);
  const docs = loadYamlDocs(kfile);
  if (docs.length !== 1) throw new RenderError(`${kfile}: expected one document`);
  const k = docs[0];
  for (const key of Object.keys(k)) {
    if (!SUPPORTED.has(key)) {
      throw new RenderError(`${kfile}: field "${key}" is not supported by this renderer (supported: ${[...SUPPORTED].join(', ')})`);
    }
  }
  if (k.kind !== 'Kustomization' || k.apiVersion !== 'kustomize.config.k8s.io/v1beta1') {
    throw new RenderError(`${kfile}: expected apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization`);
  }
  const objects = [];
  for (const r of k.resources || []) {
    const file = insideDir(dir, r);
    if (!fs.existsSync(file) || !fs.statSync(file).isFile()) {
      throw new RenderError(`${kfile}: resource ${r} is not a file (directories and remote bases are not supported by this renderer)`);
    }
    for (const obj of loadYamlDocs(file)) {
      if (typeof obj !== 'object' || Array.isArray(obj)) throw new RenderError(`${file}: a document is not an object`);
      obj.metadata = obj.metadata || {};
      Object.defineProperty(obj, '__source', { value: path.relative(dir, file), enumerable: false });
      objects.push(obj);
    }
  }
  const generated = [];
  for (const gen of k.configMapGenerator || []) {
    const cm = generateConfigMap(dir, gen, kfile);
    Object.defineProperty(cm, '__source', { value: 'kustomization.yaml (configMapGenerator)', enumerable: false });
    generated.push(cm);
    objects.push(cm);
  }
  if (k.namespace !== undefined) {
    for (const obj of objects) {
      if (!CLUSTER_SCOPED.has(obj.kind)) obj.metadata.namespace = k.namespace;
    }
  }
  for (const entry of k.labels || []) {
    for (const key of Object.keys(entry)) {
      if (key === 'pairs') continue;
      if ((key === 'includeSelectors' || key === 'includeTemplates') && entry[key] === false) continue;
      throw new RenderError(`${kfile}: labels field "${key}: ${entry[key]}" is not supported by this renderer (only pairs)`);
    }
    for (const obj of objects) {
      obj.metadata.labels = { ...(obj.metadata.labels || {}), ...entry.pairs };
    }
  }
  applyImages(objects, k.images || [], kfile);
  const renames = new Map();
  for (const cm of generated) {
    const hashed = `${cm.metadata.name}-${configMapHash(cm)}`;
    renames.set(`${cm.metadata.namespace || ''}/${cm.metadata.name}`, hashed);
    cm.metadata.name = hashed;
  }
  renameConfigMapRefs(objects, renames);
  const seen = new Set();
  for (const obj of objects) {
    const id = `${obj.apiVersion} ${obj.kind} ${obj.metadata.namespace || ''}/${obj.metadata.name}`;
    if (seen.has(id)) throw new RenderError(`${kfile}: duplicate object ${id}`);
    seen.add(id);
  }
  return objects;
}

module.exports = { render, RenderError, loadYamlDocs, podSpecs, allContainers, parseImage, configMapHash };
