'use strict';
// Unknown-field detection, like `kubectl apply --validate=strict`, which
// needs an API server (and a kubectl newer than Debian 12's 1.20); see the
// top of validate.js for why these checks are done here.
//
// kubernetes-models' validate() checks types, enums and required fields, but
// its JSON schemas allow unknown properties: a misspelt field such as
// `readOnlyRootFilesytem` would pass, and the API server would silently drop
// it. The field lists are in the package's TypeScript declarations (one
// interface per API type, generated from the same OpenAPI document as the
// schemas), so this walks an object along those declarations and reports
// every field the Kubernetes API does not know.

const fs = require('fs');
const path = require('path');

const MODELS_DIR = path.dirname(require.resolve('kubernetes-models/package.json'));

// file -> { interfaces: Map<name, Map<field, {type, required}>>,
//           aliases: Set<name>, imports: Map<name, file>, main: name }
const fileCache = new Map();

function resolveImport(fromFile, spec) {
  if (spec.startsWith('.')) {
    return path.resolve(path.dirname(fromFile), spec + '.d.ts');
  }
  // A package path: node resolution, walking up node_modules directories.
  for (let dir = path.dirname(fromFile); ; dir = path.dirname(dir)) {
    const candidate = path.join(dir, 'node_modules', spec + '.d.ts');
    if (fs.existsSync(candidate)) return candidate;
    if (dir === path.dirname(dir)) return null;
  }
}

// Splits `text` at `sep` characters that are not nested in <>, {}, () or [].
function splitTop(text, sep) {
  const parts = [];
  let depth = 0;
  let start = 0;
  let quote = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote) {
      if (c === quote) quote = null;
      continue;
    }
    if (c === '"' || c === "'") quote = c;
    else if ('<{(['.includes(c)) depth++;
    else if ('>})]'.includes(c)) depth--;
    else if (c === sep && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim()).filter((p) => p.length > 0);
}

// The text between the brace at `open` and its matching closing brace.
function braceBody(text, open) {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(open + 1, i);
  }
  throw new Error('unbalanced braces');
}

function parseFile(file) {
  if (fileCache.has(file)) return fileCache.get(file);
  const text = fs.readFileSync(file, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '');
  const info = { file, interfaces: new Map(), aliases: new Set(), imports: new Map(), main: null };
  for (const m of text.matchAll(/import \{([^}]*)\} from "([^"]+)";/g)) {
    for (const name of m[1].split(',').map((s) => s.trim()).filter(Boolean)) {
      const target = resolveImport(file, m[2]);
      if (target) info.imports.set(name, target);
    }
  }
  for (const m of text.matchAll(/export declare type (\w+)\s*=/g)) info.aliases.add(m[1]);
  for (const m of text.matchAll(/export interface (\w+)(?: extends [\w, .]+)? \{/g)) {
    const body = braceBody(text, m.index + m[0].length - 1);
    const fields = new Map();
    for (const member of splitTop(body, ';')) {
      const f = member.match(/^"([^"]+)"(\?)?:\s*([\s\S]+)$/);
      if (!f) throw new Error(`${file}: cannot parse member of ${m[1]}: ${member}`);
      fields.set(f[1], { type: f[3].trim(), required: f[2] !== '?' });
    }
    info.interfaces.set(m[1], fields);
    if (!info.main) info.main = m[1];
  }
  fileCache.set(file, info);
  return info;
}

// Resolves a type expression written in `info`'s file to one of
//   {kind: 'object', fields, info} | {kind: 'array', of} | {kind: 'map', of}
//   | {kind: 'scalar'}   (primitives, literals, aliases such as Quantity)
function resolveType(info, expr) {
  expr = expr.trim();
  let m = expr.match(/^Array<([\s\S]+)>$/);
  if (m) return { kind: 'array', of: () => resolveType(info, m[1]) };
  m = expr.match(/^\{\s*\[key: string\]:\s*([\s\S]+?);?\s*\}$/);
  if (m) return { kind: 'map', of: () => resolveType(info, m[1]) };
  if (!/^[A-Za-z_]\w*$/.test(expr)) return { kind: 'scalar' }; // unions, literals
  if (['string', 'number', 'boolean', 'any', 'unknown', 'object'].includes(expr)) {
    return { kind: 'scalar' };
  }
  if (info.interfaces.has(expr)) {
    return { kind: 'object', fields: info.interfaces.get(expr), info };
  }
  if (info.aliases.has(expr)) return { kind: 'scalar' };
  const target = info.imports.get(expr);
  if (target) {
    const other = parseFile(target);
    if (other.main) return { kind: 'object', fields: other.interfaces.get(other.main), info: other };
    return { kind: 'scalar' }; // a type alias module (IntOrString, Quantity, Time...)
  }
  return { kind: 'scalar' };
}

function walk(value, type, where, errors) {
  if (value === null || value === undefined) return;
  if (type.kind === 'array') {
    if (Array.isArray(value)) {
      const of = type.of();
      value.forEach((v, i) => walk(v, of, `${where}[${i}]`, errors));
    }
  } else if (type.kind === 'map') {
    if (typeof value === 'object' && !Array.isArray(value)) {
      const of = type.of();
      for (const [k, v] of Object.entries(value)) walk(v, of, `${where}[${JSON.stringify(k)}]`, errors);
    }
  } else if (type.kind === 'object') {
    if (typeof value !== 'object' || Array.isArray(value)) return; // the schema reports it
    for (const [k, v] of Object.entries(value)) {
      const field = type.fields.get(k);
      const at = where ? `${where}.${k}` : k;
      if (!field) {
        errors.push(`${at}: unknown field "${k}"`);
        continue;
      }
      walk(v, resolveType(type.info, field.type), at, errors);
    }
  }
}

// The declaration file of a top-level kind, or null when kubernetes-models
// does not have it.
function declarationFor(apiVersion, kind) {
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') return null;
  if (!/^[a-z0-9.\-]+(\/[a-z0-9]+)?$/.test(apiVersion) || !/^[A-Za-z0-9]+$/.test(kind)) return null;
  const file = path.join(MODELS_DIR, ...apiVersion.split('/'), `${kind}.d.ts`);
  return fs.existsSync(file) ? file : null;
}

// Returns the unknown fields of `obj` as messages ("spec.x: unknown field").
function unknownFields(obj) {
  const file = declarationFor(obj.apiVersion, obj.kind);
  if (!file) return [`no Kubernetes API type ${obj.apiVersion} ${obj.kind}`];
  const info = parseFile(file);
  const errors = [];
  walk(obj, { kind: 'object', fields: info.interfaces.get(info.main), info }, '', errors);
  return errors;
}

module.exports = { unknownFields, declarationFor };
