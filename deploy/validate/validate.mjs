// validate.mjs — offline validation of kvseal's Kubernetes manifests
// (deploy/k8s; ctest deploy_validate). No cluster is needed:
//  1. kustomization.yaml lists every manifest in its folder and nothing else;
//  2. every YAML document parses and validates against the API schema of its
//     apiVersion/kind (the kubernetes-models package: types, required fields,
//     formats); a kind without a schema is an error; and it has no field its
//     kind does not define (a misspelt optional field, which the schemas
//     allow and the API server would drop or refuse), read from the
//     package's type declarations;
//  3. the references between objects hold: Service and PodDisruptionBudget
//     selectors match a workload's pod labels, a workload's selector matches
//     its own template, Service targetPorts, probes and the Prometheus port
//     annotation name declared container ports, Secrets and ConfigMaps named
//     by volumes and env exist (with the keys named), volume mounts name pod
//     volumes, $(VAR) in args names an env var of the container, kvseal's
//     file options (--secret-file, --tenants) point under a mount, and a
//     worker's --router names a Service port.
// Usage: node validate.mjs [DIR]           validate DIR (default ../k8s)
//        node validate.mjs --cases DIR     each DIR/*.yaml alone must FAIL
//                                          with the text of its "# expect:" line
import { readFileSync, readdirSync, existsSync } from "node:fs";
import { join, dirname, basename, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));

// ----------------------------------------------------------------------------
// Loading and schema validation

/* The kubernetes-models class for apiVersion/kind, or null. */
async function modelFor(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Za-z0-9]+$/.test(kind))
    return null;
  const gv = apiVersion.includes("/") ? apiVersion : `v1`;
  if (!/^[a-z0-9.-]+(\/v[0-9a-z]+)?$/.test(gv)) return null;
  try {
    const mod = await import(`kubernetes-models/${gv}/${kind}`);
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

/* Parses one file into [{file, index, obj}], pushing parse errors to errs. */
function parseFile(path, errs) {
  const out = [];
  let docs;
  try {
    docs = parseAllDocuments(readFileSync(path, "utf8"));
  } catch (e) {
    errs.push(`${path}: cannot read: ${e.message}`);
    return out;
  }
  docs.forEach((d, i) => {
    for (const e of d.errors) errs.push(`${path} (document ${i + 1}): YAML: ${e.message}`);
    if (d.errors.length) return;
    const obj = d.toJS();
    if (obj === null || obj === undefined) return; // an empty document
    out.push({ file: path, index: i + 1, obj });
  });
  return out;
}

function where(r) {
  const m = r.obj?.metadata ?? {};
  return `${basename(r.file)}: ${r.obj?.kind ?? "?"}/${m.name ?? "?"}`;
}

async function validateSchemas(res, errs) {
  for (const r of res) {
    const o = r.obj;
    if (typeof o !== "object" || Array.isArray(o)) {
      errs.push(`${r.file} (document ${r.index}): not an object`);
      continue;
    }
    if (!o.metadata?.name) errs.push(`${where(r)}: metadata.name is required`);
    const M = await modelFor(o.apiVersion, o.kind);
    if (!M) {
      errs.push(`${where(r)}: no API schema for apiVersion ${o.apiVersion} kind ${o.kind}`);
      continue;
    }
    try {
      new M(o).validate();
    } catch (e) {
      const list = e.errors?.length
        ? e.errors.map((x) => `${x.instancePath || "/"} ${x.message}`)
        : [e.message];
      for (const m of list) errs.push(`${where(r)}: schema: ${m}`);
    }
    for (const m of unknownFields(o)) errs.push(`${where(r)}: ${m}`);
  }
}

// ----------------------------------------------------------------------------
// Unknown fields: the JSON schemas allow any extra property, so the fields of
// each kind come from kubernetes-models' TypeScript declarations (one
// interface per file: `"name"?: TYPE;`, TYPE a leaf, Array<T>, a
// { [key: string]: T } map, or an imported interface of another file)

const modules = join(here, "node_modules");
const dtsCache = new Map();

/* The fields of the interface declared in file: Map name -> type, or null
 * (a type alias such as IntOrString or Quantity: a leaf). */
function dtsFields(file) {
  if (dtsCache.has(file)) return dtsCache.get(file);
  let text;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    dtsCache.set(file, null);
    return null;
  }
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) {
    const spec = m[2];
    const target = spec.startsWith(".")
      ? resolve(dirname(file), spec.replace(/\.js$/, "") + ".d.ts")
      : join(modules, spec + ".d.ts");
    imports.set(m[1], target);
  }
  const body = text.match(/^export interface \w+(?: extends [\w, ]+)? \{\n([\s\S]*?)^\}/m);
  if (!body) {
    dtsCache.set(file, null);
    return null;
  }
  // one field per line at indent 4; a map's type spans to its closing "};"
  const fields = new Map();
  const lines = body[1].replace(/^\s*\/\*\*[\s\S]*?\*\/\n/gm, "").split("\n");
  for (let i = 0; i < lines.length; i++) {
    const m = lines[i].match(/^ {4}"([^"]+)"\??: (.*)$/);
    if (!m) continue;
    let type = m[2];
    while (type.endsWith("{") && i + 1 < lines.length) type += " " + lines[++i].trim();
    while (/\{ \[key: string\]: [^}]*$/.test(type) && i + 1 < lines.length) type += " " + lines[++i].trim();
    fields.set(m[1], parseType(type.replace(/;$/, ""), imports));
  }
  dtsCache.set(file, fields);
  return fields;
}

/* A declared type: {ref: file} | {array: T} | {map: T} | {leaf: true}. */
function parseType(t, imports) {
  t = t.trim();
  let m;
  if ((m = t.match(/^Array<(.*)>$/))) return { array: parseType(m[1], imports) };
  if ((m = t.match(/^\{ \[key: string\]: (.*?);? \}$/))) return { map: parseType(m[1], imports) };
  if (imports.has(t)) return { ref: imports.get(t) };
  return { leaf: true };
}

/* Levenshtein distance, for "did you mean". */
function distance(a, b) {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++)
    for (let j = 1; j <= b.length; j++)
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
  return d[a.length][b.length];
}

function strictWalk(v, type, path, out) {
  if (v === null || v === undefined || type.leaf) return;
  if (type.array) {
    if (Array.isArray(v)) v.forEach((x, i) => strictWalk(x, type.array, `${path}/${i}`, out));
    return;
  }
  if (type.map) {
    if (typeof v === "object" && !Array.isArray(v))
      for (const [k, x] of Object.entries(v)) strictWalk(x, type.map, `${path}/${k}`, out);
    return;
  }
  const fields = dtsFields(type.ref);
  if (!fields || typeof v !== "object" || Array.isArray(v)) return;
  for (const [k, x] of Object.entries(v)) {
    const ft = fields.get(k);
    if (ft) {
      strictWalk(x, ft, `${path}/${k}`, out);
      continue;
    }
    const near = [...fields.keys()].filter((f) => distance(f.toLowerCase(), k.toLowerCase()) <= 2);
    out.push(`${path}/${k}: unknown field${near.length ? ` (did you mean ${near.join(", ")}?)` : ""}`);
  }
}

/* The unknown fields of o, a kind of group/version gv (as modelFor). */
function unknownFields(o) {
  const gv = o.apiVersion.includes("/") ? o.apiVersion : "v1";
  const out = [];
  strictWalk(o, { ref: join(modules, "kubernetes-models", gv, `${o.kind}.d.ts`) }, "", out);
  return out;
}

// ----------------------------------------------------------------------------
// Cross-references

const WORKLOADS = new Set(["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"]);

function matches(selector, labels) {
  if (!selector || !labels) return false;
  const ml = selector.matchLabels ?? selector; // Service selectors are plain maps
  const keys = Object.keys(ml);
  if (keys.length === 0 && !selector.matchExpressions) return false; // selects everything: refuse
  for (const k of keys) if (labels[k] !== ml[k]) return false;
  for (const x of selector.matchExpressions ?? []) {
    const v = labels[x.key];
    if (x.operator === "In" && !(x.values ?? []).includes(v)) return false;
    if (x.operator === "NotIn" && (x.values ?? []).includes(v)) return false;
    if (x.operator === "Exists" && v === undefined) return false;
    if (x.operator === "DoesNotExist" && v !== undefined) return false;
  }
  return true;
}

/* The port a probe or targetPort names is declared by a container of ports. */
function portDeclared(port, ports) {
  if (port === undefined) return true;
  return (ports ?? []).some((p) => (typeof port === "number" ? p.containerPort === port : p.name === port));
}

function checkRefs(res, errs) {
  const ns = (o) => o.metadata?.namespace ?? "";
  const byKind = (k) => res.filter((r) => r.obj?.kind === k);
  const find = (kind, name, n) =>
    res.find((r) => r.obj?.kind === kind && r.obj.metadata?.name === name && ns(r.obj) === n);
  const keysOf = (o) => new Set([...Object.keys(o.data ?? {}), ...Object.keys(o.stringData ?? {})]);
  const pods = res
    .filter((r) => WORKLOADS.has(r.obj?.kind))
    .map((r) => ({ r, ns: ns(r.obj), tpl: r.obj.spec?.template ?? {} }));

  for (const p of pods) {
    const w = where(p.r), spec = p.tpl.spec ?? {}, labels = p.tpl.metadata?.labels ?? {};
    if (p.r.obj.spec?.selector && !matches(p.r.obj.spec.selector, labels))
      errs.push(`${w}: spec.selector does not match the pod template's labels`);
    const vols = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
    const refSecret = (name, key, what) => {
      const s = find("Secret", name, p.ns);
      if (!s) errs.push(`${w}: ${what} names Secret ${name}, which no manifest defines`);
      else if (key !== undefined && !keysOf(s.obj).has(key))
        errs.push(`${w}: ${what} names key ${key} of Secret ${name}, which it does not have`);
    };
    const refConfigMap = (name, key, what) => {
      const c = find("ConfigMap", name, p.ns);
      if (!c) errs.push(`${w}: ${what} names ConfigMap ${name}, which no manifest defines`);
      else if (key !== undefined && !keysOf(c.obj).has(key))
        errs.push(`${w}: ${what} names key ${key} of ConfigMap ${name}, which it does not have`);
    };
    for (const v of vols.values()) {
      if (v.secret) {
        refSecret(v.secret.secretName, undefined, `volume ${v.name}`);
        for (const it of v.secret.items ?? []) refSecret(v.secret.secretName, it.key, `volume ${v.name}`);
      }
      if (v.configMap) {
        refConfigMap(v.configMap.name, undefined, `volume ${v.name}`);
        for (const it of v.configMap.items ?? []) refConfigMap(v.configMap.name, it.key, `volume ${v.name}`);
      }
    }
    const all = [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
    for (const c of all) {
      const cw = `${w} container ${c.name}`;
      for (const m of c.volumeMounts ?? [])
        if (!vols.has(m.name)) errs.push(`${cw}: volumeMount ${m.name} names no volume of the pod`);
      const env = new Set();
      for (const e of c.env ?? []) {
        env.add(e.name);
        if (e.valueFrom?.secretKeyRef)
          refSecret(e.valueFrom.secretKeyRef.name, e.valueFrom.secretKeyRef.key, `env ${e.name}`);
        if (e.valueFrom?.configMapKeyRef)
          refConfigMap(e.valueFrom.configMapKeyRef.name, e.valueFrom.configMapKeyRef.key, `env ${e.name}`);
      }
      for (const e of c.envFrom ?? []) {
        if (e.secretRef) refSecret(e.secretRef.name, undefined, "envFrom");
        if (e.configMapRef) refConfigMap(e.configMapRef.name, undefined, "envFrom");
      }
      for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
        const pr = c[probe];
        if (!pr) continue;
        const port = pr.httpGet?.port ?? pr.tcpSocket?.port ?? pr.grpc?.port;
        if (!portDeclared(port, c.ports))
          errs.push(`${cw}: ${probe} port ${port} is not a declared container port`);
      }
      const args = [...(c.command ?? []), ...(c.args ?? [])].map(String);
      for (const a of args)
        for (const m of a.matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g))
          if (!env.has(m[1])) errs.push(`${cw}: ${a} uses $(${m[1]}), which is not in its env`);
      // kvseal's file options must point into a mounted volume
      const mounts = (c.volumeMounts ?? []).map((m) => m.mountPath.replace(/\/$/, "") + "/");
      for (const a of args) {
        const f = a.match(/^--(secret-file|tenants)=(.*)$/);
        if (f && !mounts.some((mp) => f[2].startsWith(mp)))
          errs.push(`${cw}: --${f[1]} ${f[2]} is not under any of its volume mounts`);
        const rt = a.match(/^--router=([^:]+):(\d+)$/);
        if (rt) {
          const svc = find("Service", rt[1].split(".")[0], p.ns);
          if (!svc) errs.push(`${cw}: --router ${rt[1]} names no Service`);
          else if (!(svc.obj.spec?.ports ?? []).some((sp) => sp.port === Number(rt[2])))
            errs.push(`${cw}: --router port ${rt[2]} is not a port of Service ${rt[1]}`);
        }
      }
    }
    const ann = p.tpl.metadata?.annotations ?? {};
    if (ann["prometheus.io/port"] !== undefined) {
      const port = Number(ann["prometheus.io/port"]);
      if (!(spec.containers ?? []).some((c) => portDeclared(port, c.ports)))
        errs.push(`${w}: annotation prometheus.io/port ${port} is not a declared container port`);
    }
  }

  for (const r of byKind("Service")) {
    const s = r.obj.spec ?? {};
    if (!s.selector) continue; // a Service without a selector has its own endpoints
    const hit = pods.filter((p) => p.ns === ns(r.obj) && matches(s.selector, p.tpl.metadata?.labels));
    if (!hit.length) {
      errs.push(`${where(r)}: selector ${JSON.stringify(s.selector)} matches no pod template`);
      continue;
    }
    for (const sp of s.ports ?? []) {
      const tp = sp.targetPort ?? sp.port;
      const ok = hit.some((p) => (p.tpl.spec?.containers ?? []).some((c) => portDeclared(tp, c.ports)));
      if (!ok) errs.push(`${where(r)}: port ${sp.name ?? sp.port} targets ${tp}, which its pods do not declare`);
    }
  }
  for (const r of byKind("PodDisruptionBudget")) {
    const sel = r.obj.spec?.selector;
    if (!pods.some((p) => p.ns === ns(r.obj) && matches(sel, p.tpl.metadata?.labels)))
      errs.push(`${where(r)}: selector matches no pod template`);
  }
}

// ----------------------------------------------------------------------------
// Entry points

/* The objects of a kustomization folder, checking its resource list. */
function loadKustomization(dir, errs) {
  const kpath = join(dir, "kustomization.yaml");
  if (!existsSync(kpath)) {
    errs.push(`${dir}: no kustomization.yaml`);
    return [];
  }
  const k = parseFile(kpath, errs)[0]?.obj ?? {};
  const known = ["apiVersion", "kind", "namespace", "namePrefix", "nameSuffix", "resources",
                 "images", "labels", "commonLabels", "commonAnnotations", "configMapGenerator",
                 "secretGenerator", "generatorOptions", "patches", "replicas", "components"];
  for (const key of Object.keys(k))
    if (!known.includes(key)) errs.push(`${kpath}: unknown field ${key}`);
  const listed = k.resources ?? [];
  const files = readdirSync(dir).filter((f) => /\.ya?ml$/.test(f) && f !== "kustomization.yaml");
  for (const f of files) if (!listed.includes(f)) errs.push(`${kpath}: ${f} is not in resources`);
  const res = [];
  for (const f of listed) {
    if (!existsSync(join(dir, f))) errs.push(`${kpath}: resource ${f} does not exist`);
    else res.push(...parseFile(join(dir, f), errs));
  }
  // every image kustomize rewrites is one a container uses
  const used = new Set(
    res.flatMap((r) => {
      const spec = r.obj?.spec?.template?.spec ?? {};
      return [...(spec.initContainers ?? []), ...(spec.containers ?? [])].map((c) => c.image);
    }),
  );
  for (const im of k.images ?? [])
    if (!used.has(im.name)) errs.push(`${kpath}: images names ${im.name}, which no container uses`);
  // kustomize sets the namespace of every object that has none
  if (k.namespace)
    for (const r of res)
      if (r.obj?.metadata && r.obj.kind !== "Namespace") r.obj.metadata.namespace ??= k.namespace;
  return res;
}

async function check(res, errs) {
  await validateSchemas(res, errs);
  checkRefs(res, errs);
}

async function main(argv) {
  if (argv[0] === "--cases") {
    const dir = argv[1] ?? join(here, "cases");
    let bad = 0, n = 0;
    for (const f of readdirSync(dir).filter((x) => x.endsWith(".yaml")).sort()) {
      const path = join(dir, f);
      const expect = readFileSync(path, "utf8").match(/^# expect: (.*)$/m)?.[1];
      const errs = [];
      await check(parseFile(path, errs), errs);
      n++;
      if (!expect) {
        console.log(`FAIL ${f}: no "# expect:" line`);
        bad++;
      } else if (!errs.some((e) => e.includes(expect))) {
        console.log(`FAIL ${f}: expected an error with "${expect}", got: ${errs.join(" | ") || "none"}`);
        bad++;
      } else console.log(`ok   ${f}: ${errs.find((e) => e.includes(expect))}`);
    }
    console.log(`${n - bad} passed, ${bad} failed`);
    return bad || !n ? 1 : 0;
  }
  const dir = argv[0] ?? join(here, "..", "k8s");
  const errs = [];
  const res = loadKustomization(dir, errs);
  await check(res, errs);
  for (const e of errs) console.log(`error: ${e}`);
  console.log(`${res.length} objects in ${dir}: ${errs.length ? `${errs.length} error(s)` : "valid"}`);
  return errs.length ? 1 : 0;
}

process.exitCode = await main(process.argv.slice(2));
