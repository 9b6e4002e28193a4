// Durable Objects: namespaces, their objects by name with sizes, SQL on one object, the fan-out
// query across objects (each object's error beside it), and point-in-time restore.

import { v4, acct, can } from "./api.js";
import { h, fill, field, form, table, heading, tabs, bytes, when, toast, errorBox, actionButton, confirmAction } from "./ui.js";

const PAGE_OBJECTS = 100;

function nsPath(ns, rest = "") {
  return acct(`/workers/durable_objects/namespaces/${encodeURIComponent(ns)}${rest}`);
}

function objectHref(ns, id, name) {
  return `#/do/${encodeURIComponent(ns)}/${encodeURIComponent(id)}${name ? `?${new URLSearchParams({ name })}` : ""}`;
}

export async function page(parts, q) {
  if (parts.length === 0) return namespaces();
  const namespace = await v4("GET", nsPath(parts[0]));
  if (parts.length === 1) return objects(namespace, q.get("cursor") ?? "", q.get("view") ?? "objects");
  return objectPage(namespace, parts[1], q.get("name"));
}

async function namespaces() {
  const list = await v4("GET", acct("/workers/durable_objects/namespaces"));
  const rows = list.map((n) => [h("a", { href: `#/do/${encodeURIComponent(n.id)}` }, n.name), n.class ?? "", n.script ?? "", when(n.created_on)]);
  return h(
    "section",
    {},
    heading([], "Durable Objects"),
    h("p", { class: "muted" }, "Namespaces come from ", h("code", {}, "wrangler deploy"), ", ", h("code", {}, "kura do"), " or the API."),
    table(["Namespace", "Class", "Script", "Created"], rows, { empty: "No namespaces yet." }),
  );
}

function resultTable(columns, rows) {
  return columns.length ? table(columns, rows) : h("p", { class: "muted" }, "No rows.");
}

async function objects(namespace, cursor, view) {
  const base = `#/do/${encodeURIComponent(namespace.id)}`;
  const head = [
    heading([["Durable Objects", "#/do"]], namespace.name),
    h("p", { class: "muted facts" }, [namespace.class ? `class ${namespace.class}` : null, namespace.script ? `script ${namespace.script}` : null, namespace.id].filter(Boolean).join(" · ")),
    tabs([["objects", "Objects", base], ["fan-out", "Query all objects", `${base}?view=fan-out`]], view),
  ];
  if (view === "fan-out") return h("section", {}, head, fanOut(namespace));
  const q = new URLSearchParams({ limit: String(PAGE_OBJECTS) });
  if (cursor) q.set("cursor", cursor);
  const answer = await v4("GET", nsPath(namespace.id, `/objects?${q}`), undefined, { envelope: true });
  const rows = answer.result.map((o) => [
    h("a", { href: objectHref(namespace.id, o.id, o.name) }, o.name ?? "(no name)"),
    h("code", { class: "object-id" }, o.id),
    bytes(o.stored_bytes),
    when(o.created_on),
  ]);
  const next = answer.result_info?.cursor;
  const pager = h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    cursor ? h("a", { href: base }, "← First page") : h("span", { class: "muted" }, "← First page"),
    h("span", { class: "page-count" }, `${rows.length} objects on this page`),
    next ? h("a", { href: `${base}?cursor=${encodeURIComponent(next)}`, rel: "next" }, "Next page →") : h("span", { class: "muted" }, "Next page →"),
  );
  return h("section", {}, head, pager, table(["Name", "Id", "Stored", "Created"], rows, { empty: "No objects yet." }));
}

function fanOut(namespace) {
  const sql = h("textarea", { name: "sql", rows: 4, class: "code", spellcheck: "false", required: true });
  sql.value = "SELECT name FROM sqlite_master WHERE type = 'table'";
  const out = h("div", { class: "results", "aria-live": "polite" });
  return h(
    "div",
    {},
    h("p", { class: "muted" }, "One read-only statement on every object of the namespace. Each object answers at its own moment; an object's error is shown beside it."),
    form([field("SQL", sql)], "Run on every object", async () => {
      const answer = await v4("POST", nsPath(namespace.id, "/fan_out"), { sql: sql.value });
      fill(
        out,
        h("p", {}, `${answer.objects.length} objects answered.`),
        answer.objects.map((o) =>
          h(
            "div",
            { class: "result" },
            h("h3", {}, h("a", { href: objectHref(namespace.id, o.id, o.name) }, o.name ?? o.id)),
            o.error ? errorBox(o.error) : resultTable(o.columns ?? [], o.rows ?? []),
          ),
        ),
      );
    }, { "aria-label": "Query every object" }),
    out,
  );
}

async function objectPage(namespace, id, name) {
  const path = (rest) => nsPath(namespace.id, `/objects/${encodeURIComponent(id)}${rest}`);
  const sql = h("textarea", { name: "sql", rows: 6, class: "code", spellcheck: "false", required: true });
  sql.value = "SELECT name, type FROM sqlite_master";
  const out = h("div", { class: "results", "aria-live": "polite" });
  const run = async () => {
    try {
      const results = await v4("POST", path("/query"), { sql: sql.value });
      showCurrent();
      fill(
        out,
        results.map((r) =>
          h("div", { class: "result" }, h("dl", { class: "meta" }, h("dt", {}, "rows read"), h("dd", {}, String(r.meta.rows_read)), h("dt", {}, "rows written"), h("dd", {}, String(r.meta.rows_written))), resultTable(r.columns, r.rows)),
        ),
      );
    } catch (e) {
      fill(out, errorBox(e));
    }
  };
  sql.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      run();
    }
  });

  const pitr = h("div", { "aria-live": "polite" });
  /** The object's current bookmark, asked again after each change. */
  const showCurrent = async () => {
    try {
      const { bookmark: current } = await v4("GET", path("/bookmark"));
      fill(pitr, h("p", {}, "Current bookmark: ", h("code", { class: "bookmark" }, current)));
    } catch (e) {
      fill(pitr, e.status === 404 ? h("p", { class: "muted" }, "The object has stored nothing yet.") : errorBox(e));
    }
  };
  await showCurrent();
  const bookmark = h("input", { name: "bookmark", class: "code", autocomplete: "off", spellcheck: "false", required: true });
  const minute = h("input", { name: "minute", type: "datetime-local", step: 60 });
  const restoreArea = h("div", { "aria-live": "polite" });
  const restoreTo = async (target) => {
    if (!confirmAction(`Restore this object to ${target}?`)) return;
    const restored = await v4("POST", path("/restore"), { bookmark: target });
    toast("Restored");
    showCurrent();
    fill(
      restoreArea,
      h("p", {}, "Restored; now at ", h("code", { class: "bookmark" }, restored.bookmark), "."),
      h("p", {}, "Undo point: ", h("code", { class: "bookmark" }, restored.previous_bookmark)),
      actionButton("Undo this restore", async () => {
        const undone = await v4("POST", path("/restore"), { bookmark: restored.previous_bookmark });
        toast("Restore undone");
        showCurrent();
        fill(restoreArea, h("p", {}, "Undone; now at ", h("code", { class: "bookmark" }, undone.bookmark), "."));
      }),
    );
  };
  const restoreForms = can("do:write")
    ? h(
        "div",
        { class: "pickers" },
        form([field("Bookmark", bookmark)], "Restore", async () => restoreTo(bookmark.value.trim()), { "aria-label": "Restore to a bookmark" }),
        form([field("A minute (your time zone)", minute)], "Find its bookmark", async () => {
          if (!minute.value) throw new Error("Pick a minute first");
          const at = new Date(new Date(minute.value).getTime() + 59_999).toISOString();
          bookmark.value = (await v4("GET", path(`/bookmark?timestamp=${encodeURIComponent(at)}`))).bookmark;
          bookmark.focus();
        }, { "aria-label": "Find the bookmark of a minute" }),
      )
    : null;

  return h(
    "section",
    {},
    heading([["Durable Objects", "#/do"], [namespace.name, `#/do/${encodeURIComponent(namespace.id)}`]], name ?? (id.length > 24 ? `${id.slice(0, 12)}…` : id)),
    h("p", { class: "muted facts" }, h("code", {}, id)),
    h("h2", {}, "SQL"),
    form([field("SQL", sql, can("do:write") ? "Ctrl+Enter runs it; several statements are one transaction." : "Read-only token: statements that write are refused.")], "Run", run, { "aria-label": "Run SQL on this object" }),
    out,
    h("h2", {}, "Point-in-time restore"),
    pitr,
    restoreForms,
    restoreArea,
  );
}
