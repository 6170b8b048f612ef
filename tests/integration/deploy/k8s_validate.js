#!/usr/bin/env node
/*
 * Validate Kubernetes objects offline against the schemas of the npm
 * package kubernetes-models.
 *
 * usage: node k8s_validate.js <node_modules dir> < objects.json
 *   stdin: a JSON array of objects (rendered manifests, converted to JSON).
 *   stdout: one JSON document {"checked": N, "errors": [{index, kind, name, message}]}.
 *   exit status: 0 when every object is valid, 1 when one is not, 2 on a usage error.
 *
 * Two checks per object:
 *  1. the package's schema validation (types, required fields, enums, formats);
 *  2. unknown fields: the package's schemas accept any extra property, so a
 *     typo such as "readinesProbe" would pass. The field names of every type
 *     are read from the package's TypeScript declarations (.d.ts) and each
 *     object is walked against them.
 */
"use strict";

const fs = require("fs");
const path = require("path");

if (process.argv.length < 3) {
    process.stderr.write("usage: k8s_validate.js <node_modules dir> < objects.json\n");
    process.exit(2);
}
const modulesDir = path.resolve(process.argv[2]);
const kmDir = path.join(modulesDir, "kubernetes-models");
if (!fs.existsSync(path.join(kmDir, "package.json"))) {
    process.stderr.write(`kubernetes-models is not installed under ${modulesDir}\n`);
    process.exit(2);
}

/* apiVersion "apps/v1" -> module "kubernetes-models/apps/v1"; "v1" -> ".../v1". */
function modelClass(apiVersion, kind) {
    if (typeof apiVersion !== "string" || typeof kind !== "string") {
        return null;
    }
    let mod;
    try {
        mod = require(path.join(kmDir, apiVersion));
    } catch (e) {
        return null;
    }
    return typeof mod[kind] === "function" ? { cls: mod[kind], dts: path.join(kmDir, apiVersion, kind + ".d.ts") } : null;
}

/* ---- field names from the .d.ts declarations ---------------------------- */

const ifaceCache = new Map(); /* file -> {props: Map(name -> type node)} | null */

function resolveImport(fromFile, spec) {
    if (spec.startsWith(".")) {
        return path.resolve(path.dirname(fromFile), spec + ".d.ts");
    }
    return path.join(modulesDir, spec + ".d.ts");
}

/* Split "a; b; { c; }; d" at top-level semicolons. */
function splitTop(s) {
    const out = [];
    let depth = 0;
    let cur = "";
    for (const ch of s) {
        if (ch === "{" || ch === "<" || ch === "(") depth++;
        if (ch === "}" || ch === ">" || ch === ")") depth--;
        if (ch === ";" && depth === 0) {
            if (cur.trim() !== "") out.push(cur.trim());
            cur = "";
        } else {
            cur += ch;
        }
    }
    if (cur.trim() !== "") out.push(cur.trim());
    return out;
}

function typeNode(typeStr, imports) {
    const t = typeStr.trim();
    let m = /^Array<([\s\S]+)>$/.exec(t);
    if (m) {
        return { array: typeNode(m[1], imports) };
    }
    m = /^\{\s*\[key: string\]:\s*([\s\S]+?);?\s*\}$/.exec(t);
    if (m) {
        return { map: typeNode(m[1], imports) };
    }
    if (imports.has(t)) {
        return { file: imports.get(t) };
    }
    return { leaf: t };
}

function loadIface(file) {
    if (ifaceCache.has(file)) {
        return ifaceCache.get(file);
    }
    ifaceCache.set(file, null);
    let text;
    try {
        text = fs.readFileSync(file, "utf8");
    } catch (e) {
        return null;
    }
    text = text.replace(/\/\*[\s\S]*?\*\//g, "");
    const imports = new Map();
    for (const m of text.matchAll(/^import \{ ([^}]+) \} from "([^"]+)";/gm)) {
        for (const name of m[1].split(",").map((s) => s.trim())) {
            imports.set(name, resolveImport(file, m[2]));
        }
    }
    const im = /export interface \w+(?: extends [\w, ]+)? \{([\s\S]*?)\n\}/.exec(text);
    if (!im) {
        return null; /* a type alias (IntOrString, Quantity, Time...): a leaf */
    }
    const props = new Map();
    for (const entry of splitTop(im[1].replace(/\s+/g, " "))) {
        const pm = /^"([^"]+)"\??:\s*([\s\S]+)$/.exec(entry);
        if (pm) {
            props.set(pm[1], typeNode(pm[2], imports));
        }
    }
    const iface = { props };
    ifaceCache.set(file, iface);
    return iface;
}

function walk(value, node, where, errors) {
    if (value === null || value === undefined) {
        return;
    }
    if (node.array) {
        if (Array.isArray(value)) {
            value.forEach((v, i) => walk(v, node.array, `${where}[${i}]`, errors));
        }
        return;
    }
    if (node.map) {
        if (typeof value === "object" && !Array.isArray(value)) {
            for (const [k, v] of Object.entries(value)) {
                walk(v, node.map, `${where}.${k}`, errors);
            }
        }
        return;
    }
    if (node.file) {
        const iface = loadIface(node.file);
        if (!iface || typeof value !== "object" || Array.isArray(value)) {
            return;
        }
        for (const [k, v] of Object.entries(value)) {
            const child = iface.props.get(k);
            if (!child) {
                errors.push(`${where}.${k}: unknown field`);
                continue;
            }
            walk(v, child, `${where}.${k}`, errors);
        }
    }
}

/* ---- main ----------------------------------------------------------------- */

let objects;
try {
    objects = JSON.parse(fs.readFileSync(0, "utf8"));
} catch (e) {
    process.stderr.write(`stdin is not JSON: ${e.message}\n`);
    process.exit(2);
}
if (!Array.isArray(objects)) {
    process.stderr.write("stdin must be a JSON array of objects\n");
    process.exit(2);
}

const errors = [];
objects.forEach((obj, index) => {
    const kind = obj && obj.kind;
    const name = obj && obj.metadata && obj.metadata.name;
    const report = (message) => errors.push({ index, kind, name, message });
    const found = modelClass(obj && obj.apiVersion, kind);
    if (!found) {
        report(`unknown apiVersion/kind ${obj && obj.apiVersion}/${kind}`);
        return;
    }
    try {
        new found.cls(obj).validate();
    } catch (e) {
        report(String(e.message || e));
    }
    const unknown = [];
    walk(obj, { file: found.dts }, kind, unknown);
    unknown.forEach(report);
});

process.stdout.write(JSON.stringify({ checked: objects.length, errors }, null, 1) + "\n");
process.exit(errors.length === 0 ? 0 : 1);
