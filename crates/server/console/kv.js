// Workers KV: namespaces (create, rename, delete), keys by prefix a page at a time, one key's
// value with its metadata and expiry, and writing or deleting a key.

import { v4, acct, can, session, ApiError } from "./api.js";
import { h, fill, field, form, table, heading, bytes, when, toast, actionButton, confirmAction } from "./ui.js";

const PAGE_KEYS = 100;
/** Values up to this size are shown as text; larger ones are described. */
const SHOWN_BYTES = 64 * 1024;

function nsPath(id, rest = "") {
  return acct(`/storage/kv/namespaces/${encodeURIComponent(id)}${rest}`);
}

function keyHref(ns, key) {
  return `#/kv/${encodeURIComponent(ns)}/${encodeURIComponent(key)}`;
}

function expiry(seconds) {
  return seconds ? when(seconds * 1000) : "never";
}

export async function page(parts, q) {
  if (parts.length === 0) return namespaces();
  const namespace = await v4("GET", nsPath(parts[0]));
  if (parts.length === 1) return keys(namespace, q.get("prefix") ?? "", q.get("cursor") ?? "");
  return keyPage(namespace, parts[1]);
}

async function namespaces() {
  const all = [];
  for (let page = 1; ; page += 1) {
    const batch = await v4("GET", acct(`/storage/kv/namespaces?per_page=100&order=title&page=${page}`));
    all.push(...batch);
    if (batch.length < 100) break;
  }
  const rows = all.map((n) => [h("a", { href: `#/kv/${encodeURIComponent(n.id)}` }, n.title), h("code", {}, n.id)]);
  const title = h("input", { name: "title", required: true, maxlength: 512, spellcheck: "false" });
  const create = can("kv:write")
    ? form([field("Title", title)], "Create namespace", async () => {
        const made = await v4("POST", acct("/storage/kv/namespaces"), { title: title.value.trim() });
        toast(`Namespace ${made.title} created`);
        location.hash = `#/kv/${encodeURIComponent(made.id)}`;
      }, { "aria-label": "Create a namespace", class: "inline" })
    : null;
  return h(
    "section",
    {},
    heading([], "Workers KV"),
    h("p", { class: "muted" }, "Namespaces come from ", h("code", {}, "wrangler kv namespace create"), ", ", h("code", {}, "wrangler deploy"), " or the API. Reads see every acknowledged write at once."),
    create,
    table(["Namespace", "Id"], rows, { empty: "No namespaces yet." }),
  );
}

async function keys(namespace, prefix, cursor) {
  const base = `#/kv/${encodeURIComponent(namespace.id)}`;
  const q = new URLSearchParams({ limit: String(PAGE_KEYS) });
  if (prefix) q.set("prefix", prefix);
  if (cursor) q.set("cursor", cursor);
  const answer = await v4("GET", nsPath(namespace.id, `/keys?${q}`), undefined, { envelope: true });
  const rows = answer.result.map((k) => [
    h("a", { href: keyHref(namespace.id, k.name) }, k.name),
    expiry(k.expiration),
    k.metadata === undefined ? "" : h("code", {}, JSON.stringify(k.metadata)),
  ]);
  const next = answer.result_info?.cursor;
  const withPrefix = (extra) => {
    const p = new URLSearchParams(extra);
    if (prefix) p.set("prefix", prefix);
    const text = p.toString();
    return text ? `${base}?${text}` : base;
  };
  const pager = h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    cursor ? h("a", { href: withPrefix({}) }, "← First page") : h("span", { class: "muted" }, "← First page"),
    h("span", { class: "page-count" }, `${rows.length} keys on this page`),
    next ? h("a", { href: withPrefix({ cursor: next }), rel: "next" }, "Next page →") : h("span", { class: "muted" }, "Next page →"),
  );
  const prefixInput = h("input", { name: "prefix", value: prefix, spellcheck: "false" });
  const filter = form([field("Prefix", prefixInput)], "Show keys", async () => {
    location.hash = prefixInput.value ? `${base}?${new URLSearchParams({ prefix: prefixInput.value })}` : base;
  }, { "aria-label": "Filter keys by prefix", class: "inline" });
  const actions = can("kv:write")
    ? [
        actionButton("Rename", async () => {
          const title = prompt("New title", namespace.title);
          if (!title) return;
          await v4("PUT", nsPath(namespace.id), { title });
          toast(`Renamed to ${title}`);
          location.reload();
        }),
        actionButton("Delete namespace", async () => {
          if (!(await confirmAction(`Delete the namespace ${namespace.title} and every key in it?`))) return;
          await v4("DELETE", nsPath(namespace.id));
          toast(`Namespace ${namespace.title} deleted`);
          location.hash = "#/kv";
        }, { class: "danger" }),
      ]
    : [];
  return h(
    "section",
    {},
    heading([["Workers KV", "#/kv"]], namespace.title, ...actions),
    h("p", { class: "muted facts" }, namespace.id),
    filter,
    can("kv:write") ? putForm(namespace) : null,
    pager,
    table(["Key", "Expires", "Metadata"], rows, { empty: prefix ? "No key has this prefix." : "No keys yet." }),
  );
}

function putForm(namespace, key = "") {
  const name = h("input", { name: "key", required: true, value: key, spellcheck: "false" });
  const value = h("textarea", { name: "value", rows: 3, class: "code", spellcheck: "false" });
  const metadata = h("input", { name: "metadata", spellcheck: "false", placeholder: '{"owner": "me"}' });
  const ttl = h("input", { name: "ttl", type: "number", min: 60, placeholder: "never expires" });
  return form(
    [field("Key", name), field("Value", value), field("Metadata (JSON)", metadata), field("Expires after (seconds, at least 60)", ttl)],
    "Write key",
    async () => {
      const q = ttl.value ? `?${new URLSearchParams({ expiration_ttl: ttl.value })}` : "";
      const path = `/client/v4${nsPath(namespace.id, `/values/${encodeURIComponent(name.value)}${q}`)}`;
      const body = new FormData();
      body.append("value", value.value);
      if (metadata.value.trim()) {
        JSON.parse(metadata.value);
        body.append("metadata", metadata.value);
      }
      const response = await fetch(path, { method: "PUT", headers: { authorization: `Bearer ${session.token}` }, body });
      const answer = await response.json().catch(() => ({}));
      if (!answer.success) throw new ApiError(response.status, answer.errors?.[0]?.message ?? `${response.status} ${response.statusText}`);
      toast(`Wrote ${name.value}`);
      location.hash = keyHref(namespace.id, name.value);
    },
    { "aria-label": "Write a key" },
  );
}

async function keyPage(namespace, key) {
  const path = `/client/v4${nsPath(namespace.id, `/values/${encodeURIComponent(key)}`)}`;
  const response = await fetch(path, { headers: { authorization: `Bearer ${session.token}` } });
  if (response.status === 404) throw new ApiError(404, `The key ${key} holds no value (it may have expired).`);
  if (!response.ok) throw new ApiError(response.status, `${response.status} ${response.statusText}`);
  const value = await response.arrayBuffer();
  const expiration = Number(response.headers.get("expiration")) || null;
  const metadata = await v4("GET", nsPath(namespace.id, `/metadata/${encodeURIComponent(key)}`));
  let shown;
  if (value.byteLength > SHOWN_BYTES) {
    shown = h("p", { class: "muted" }, `${bytes(value.byteLength)}: too large to show here.`);
  } else {
    try {
      shown = h("pre", { class: "code value" }, new TextDecoder("utf-8", { fatal: true }).decode(value));
    } catch {
      shown = h("p", { class: "muted" }, `${bytes(value.byteLength)} of binary data.`);
    }
  }
  const actions = can("kv:write")
    ? [
        actionButton("Delete key", async () => {
          if (!(await confirmAction(`Delete ${key}?`))) return;
          await v4("DELETE", nsPath(namespace.id, `/values/${encodeURIComponent(key)}`));
          toast(`Deleted ${key}`);
          location.hash = `#/kv/${encodeURIComponent(namespace.id)}`;
        }, { class: "danger" }),
      ]
    : [];
  return h(
    "section",
    {},
    heading([["Workers KV", "#/kv"], [namespace.title, `#/kv/${encodeURIComponent(namespace.id)}`]], key, ...actions),
    table(["Size", "Expires", "Metadata"], [[bytes(value.byteLength), expiry(expiration), metadata === null ? "none" : h("code", {}, JSON.stringify(metadata))]]),
    h("h2", {}, "Value"),
    shown,
    can("kv:write") ? [h("h2", {}, "Write again"), putForm(namespace, key)] : null,
  );
}
