// D1: databases, a table browser that pages, the SQL editor, Time Travel, export and import.

import { v4, acct, can, md5Hex } from "./api.js";
import { h, fill, field, form, table, heading, tabs, bytes, when, toast, errorBox, progress, actionButton, confirmAction } from "./ui.js";

const PAGE_ROWS = 50;

function dbPath(db, rest = "") {
  return acct(`/d1/database/${encodeURIComponent(db)}${rest}`);
}

/** Runs SQL through the v4 `/query`; answers D1's result list (rows as objects). */
export function query(db, sql, params) {
  return v4("POST", dbPath(db, "/query"), params ? { sql, params } : { sql });
}

/** Runs SQL through the v4 `/raw`: rows as arrays beside the column list, so columns keep their
 * order and repeated names (objects would lose both). */
function raw(db, sql, params) {
  return v4("POST", dbPath(db, "/raw"), params ? { sql, params } : { sql });
}

/** A path and query of a URL the API answered, so it is fetched from the origin the console
 * was loaded from (the API builds absolute URLs from the Host it saw, which a proxy may change). */
function sameOrigin(url) {
  const u = new URL(url, location.href);
  return `${u.pathname}${u.search}`;
}

/** An identifier quoted for SQLite. */
export function quoteId(name) {
  return `"${String(name).replaceAll('"', '""')}"`;
}

export async function page(parts, q) {
  if (parts.length === 0) return list();
  const [db, view = "tables", name] = parts;
  const details = await v4("GET", dbPath(db));
  const views = [
    ["tables", "Tables", `#/d1/${encodeURIComponent(details.uuid)}`],
    ["query", "Query", `#/d1/${encodeURIComponent(details.uuid)}/query`],
    ["time-travel", "Time Travel", `#/d1/${encodeURIComponent(details.uuid)}/time-travel`],
    ["transfer", "Export and import", `#/d1/${encodeURIComponent(details.uuid)}/transfer`],
  ];
  const current = view === "table" ? "tables" : view;
  const head = [
    heading([["D1", "#/d1"]], details.name),
    h("p", { class: "muted facts" }, `${details.uuid} · ${bytes(details.file_size)} · ${details.num_tables} tables · created ${when(details.created_at)}`),
    tabs(views, current),
  ];
  let body;
  if (view === "table") body = await tableView(details, name, Number(q.get("page") ?? 1));
  else if (view === "query") body = queryView(details);
  else if (view === "time-travel") body = await timeTravelView(details);
  else if (view === "transfer") body = transferView(details);
  else body = await tablesView(details);
  return h("section", {}, head, body);
}

async function list() {
  const databases = await v4("GET", acct("/d1/database?per_page=10000"));
  // Size and table counts come with each database's details (as the dashboard shows them), for
  // the first 100; the rest are listed without them.
  const details = await Promise.all(databases.map((d, i) => (i < 100 ? v4("GET", dbPath(d.uuid)).catch(() => d) : d)));
  const rows = details.map((d) => [
    h("a", { href: `#/d1/${encodeURIComponent(d.uuid)}` }, d.name),
    h("code", {}, d.uuid),
    d.file_size === undefined ? "" : bytes(d.file_size),
    d.num_tables ?? "",
    when(d.created_at),
  ]);
  const create = can("d1:write")
    ? (() => {
        const name = h("input", { name: "name", required: true, pattern: "[a-z0-9][a-z0-9_\\-]*", autocomplete: "off" });
        return h(
          "details",
          { class: "panel" },
          h("summary", {}, "Create a database"),
          form([field("Name", name, "Lowercase letters, digits, - and _")], "Create", async () => {
            const created = await v4("POST", acct("/d1/database"), { name: name.value.trim() });
            toast(`Created ${created.name}`);
            location.hash = `#/d1/${encodeURIComponent(created.uuid)}`;
          }, { "aria-label": "Create a database" }),
        );
      })()
    : null;
  return h("section", {}, heading([], "D1 databases"), create, table(["Name", "Id", "Size", "Tables", "Created"], rows, { empty: "No databases yet." }));
}

async function tablesView(details) {
  const [tables] = await query(
    details.uuid,
    "SELECT name, type FROM sqlite_master WHERE type IN ('table','view') AND substr(name, 1, 7) <> 'sqlite_' AND substr(name, 1, 4) <> '_cf_' ORDER BY name",
  );
  // One count per table, each on its own: a view that fails to count shows "?", not an error page.
  const counts = await Promise.all(
    tables.results.map((t) => query(details.uuid, `SELECT count(*) AS n FROM ${quoteId(t.name)}`).then(([r]) => r.results[0]?.n, () => "?")),
  );
  const rows = tables.results.map((t, i) => [
    h("a", { href: `#/d1/${encodeURIComponent(details.uuid)}/table/${encodeURIComponent(t.name)}` }, t.name),
    t.type,
    counts[i] ?? "",
  ]);
  const actions = can("d1:write")
    ? actionButton("Delete database", async () => {
        if (!confirmAction(`Delete ${details.name}? Its Time Travel history goes too.`)) return;
        await v4("DELETE", dbPath(details.uuid));
        toast(`Deleted ${details.name}`);
        location.hash = "#/d1";
      }, { class: "danger" })
    : null;
  return h("div", {}, table(["Table", "Type", "Rows"], rows, { empty: "No tables yet: create one in Query." }), h("div", { class: "actions" }, actions));
}

async function tableView(details, name, pageNumber) {
  const pageIndex = Math.max(1, Number.isFinite(pageNumber) ? Math.floor(pageNumber) : 1);
  const [[countResult], [pageResult]] = await Promise.all([
    query(details.uuid, `SELECT count(*) AS n FROM ${quoteId(name)}`),
    // One page at a time: LIMIT/OFFSET, so a big table never comes over whole.
    raw(details.uuid, `SELECT * FROM ${quoteId(name)} LIMIT ? OFFSET ?`, [PAGE_ROWS, (pageIndex - 1) * PAGE_ROWS]),
  ]);
  const total = countResult.results[0].n;
  const pages = Math.max(1, Math.ceil(total / PAGE_ROWS));
  if (pageIndex > pages) {
    location.replace(`#/d1/${encodeURIComponent(details.uuid)}/table/${encodeURIComponent(name)}?page=${pages}`);
  }
  const { columns, rows } = pageResult.results;
  const base = `#/d1/${encodeURIComponent(details.uuid)}/table/${encodeURIComponent(name)}`;
  const pager = h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    pageIndex > 1 ? h("a", { href: `${base}?page=${pageIndex - 1}`, rel: "prev" }, "← Previous") : h("span", { class: "muted" }, "← Previous"),
    h("span", { class: "page-count" }, `Page ${pageIndex} of ${pages} · ${total} rows`),
    pageIndex < pages ? h("a", { href: `${base}?page=${pageIndex + 1}`, rel: "next" }, "Next →") : h("span", { class: "muted" }, "Next →"),
  );
  return h(
    "div",
    {},
    h("h2", {}, name),
    pager,
    table(columns, rows, { empty: "This table is empty." }),
  );
}

function metaLine(meta) {
  if (!meta) return null;
  return h(
    "dl",
    { class: "meta" },
    [
      ["changes", meta.changes],
      ["rows read", meta.rows_read],
      ["rows written", meta.rows_written],
      ["last row id", meta.last_row_id],
      ["duration", `${Number(meta.duration ?? 0).toFixed(3)} ms`],
      ["size after", meta.size_after === undefined ? undefined : bytes(meta.size_after)],
    ]
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]),
  );
}

function resultsView(results) {
  return results.map((result, i) => {
    const { columns = [], rows = [] } = result.results ?? {};
    return h(
      "div",
      { class: "result" },
      results.length > 1 ? h("h3", {}, `Statement ${i + 1}`) : null,
      metaLine(result.meta),
      rows.length ? table(columns, rows) : h("p", { class: "muted" }, "No rows."),
    );
  });
}

function queryView(details) {
  const sql = h("textarea", { name: "sql", rows: 8, spellcheck: "false", class: "code", required: true }, "");
  sql.value = sessionStorage.getItem(`kura.sql.${details.uuid}`) ?? "SELECT name FROM sqlite_master WHERE type = 'table';";
  const out = h("div", { class: "results", "aria-live": "polite" });
  let running = false;
  const run = async () => {
    if (running) return;
    running = true;
    sessionStorage.setItem(`kura.sql.${details.uuid}`, sql.value);
    fill(out, h("p", { class: "muted" }, "Running…"));
    try {
      fill(out, resultsView(await raw(details.uuid, sql.value)));
    } catch (e) {
      fill(out, errorBox(e));
    } finally {
      running = false;
    }
  };
  sql.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      run();
    }
  });
  const f = form([field("SQL", sql, can("d1:write") ? "Ctrl+Enter runs it. Several statements run in one transaction." : "Read-only token: statements that write are refused.")], "Run", run, { "aria-label": "Run SQL" });
  return h("div", {}, f, out);
}

async function timeTravelView(details) {
  const chosen = h("div", { class: "chosen", "aria-live": "polite" });
  const undoArea = h("div", { class: "undo", "aria-live": "polite" });
  const overview = h("div", { class: "overview" });
  const latest = h("div", { class: "latest" });
  let entries = [];

  /** The current bookmark, commits per minute and the latest commits, fetched again. */
  async function drawTimeline() {
    const history = await v4("GET", dbPath(details.uuid, "/time_travel/history?limit=1000"));
    entries = history.entries;
    const buckets = new Map();
    for (const e of entries) {
      const minute = Math.floor(Date.parse(e.timestamp) / 60_000);
      buckets.set(minute, (buckets.get(minute) ?? 0) + 1);
    }
    const minutes = [...buckets.keys()].sort((a, b) => a - b).slice(-60);
    const max = Math.max(1, ...buckets.values());
    const chart = minutes.length
      ? h(
          "div",
          { class: "chart", role: "group", "aria-label": "Commits per minute; choose a minute to restore to its end" },
          minutes.map((m) => {
            const n = buckets.get(m);
            const bar = h("button", {
              type: "button",
              class: "bar",
              title: `${new Date(m * 60_000).toLocaleString()}: ${n} commits`,
              "aria-label": `${new Date(m * 60_000).toLocaleTimeString()}, ${n} commits`,
              onclick: () => choose({ timestamp: new Date((m + 1) * 60_000 - 1).toISOString() }),
            });
            // Through the CSSOM, which the console's content security policy allows (no inline styles).
            bar.style.height = `${Math.max(4, Math.round((60 * n) / max))}px`;
            return bar;
          }),
        )
      : h("p", { class: "muted" }, "No commits in the Time Travel window.");
    const span = minutes.length
      ? h("p", { class: "muted chart-span" }, `${new Date(minutes[0] * 60_000).toLocaleString()} to ${new Date(minutes[minutes.length - 1] * 60_000).toLocaleString()}, one bar per minute with commits`)
      : null;
    fill(
      overview,
      h("p", {}, "Current bookmark: ", h("code", { class: "bookmark current" }, history.current)),
      h("h2", {}, "Commits over time"),
      chart,
      span,
    );
    const rows = entries.slice(0, 200).map((e) => [
      when(e.timestamp),
      e.kind,
      h("code", { class: "bookmark" }, e.bookmark),
      h("button", { type: "button", class: "link", "aria-label": `Choose the ${e.kind} of ${when(e.timestamp)}`, onclick: () => choose({ bookmark: e.bookmark }) }, "Choose"),
    ]);
    fill(latest, h("h2", {}, "Latest commits"), table(["Time", "Kind", "Bookmark", ""], rows, { empty: "No commits in the window." }));
  }

  const preview = async (target) => {
    if (target.bookmark) {
      const found = entries.find((e) => e.bookmark === target.bookmark);
      if (!found) {
        // Not among the latest: the server checks it (malformed, unknown, or out of the window).
        await v4("GET", dbPath(details.uuid, `/time_travel/history?limit=1&before=${encodeURIComponent(target.bookmark)}`));
      }
      return { bookmark: target.bookmark, timestamp: found?.timestamp };
    }
    const { bookmark } = await v4("GET", dbPath(details.uuid, `/time_travel/bookmark?timestamp=${encodeURIComponent(target.timestamp)}`));
    const found = entries.find((e) => e.bookmark === bookmark);
    return { bookmark, timestamp: found?.timestamp ?? target.timestamp };
  };

  async function choose(target) {
    try {
      const p = await preview(target);
      const newer = entries.findIndex((e) => e.bookmark === p.bookmark);
      const undone = newer > 0 ? ` ${newer} later commit${newer === 1 ? "" : "s"} would be undone (the restore itself can be undone).` : newer === 0 ? " This is the current state." : "";
      fill(
        chosen,
        h("h3", {}, "Restore point"),
        h("p", {}, h("code", { class: "bookmark" }, p.bookmark)),
        h("p", { class: "muted" }, p.timestamp ? `The state after the commit of ${when(p.timestamp)}.` : "", undone),
        can("d1:write")
          ? actionButton("Restore to this point", async () => {
              if (!confirmAction(`Restore ${details.name} to ${p.bookmark}?`)) return;
              const restored = await v4("POST", dbPath(details.uuid, `/time_travel/restore?bookmark=${encodeURIComponent(p.bookmark)}`));
              fill(chosen);
              showUndo(restored);
              await drawTimeline();
            }, { class: "primary" })
          : null,
      );
    } catch (e) {
      fill(chosen, errorBox(e));
    }
  }

  function showUndo(restored) {
    toast("Restored");
    fill(
      undoArea,
      h("h3", {}, "Restored"),
      h("p", {}, "Now at ", h("code", { class: "bookmark" }, restored.bookmark), "."),
      h("p", {}, "Undo point: ", h("code", { class: "bookmark undo-bookmark" }, restored.previous_bookmark)),
      can("d1:write")
        ? actionButton("Undo this restore", async () => {
            const undone = await v4("POST", dbPath(details.uuid, `/time_travel/restore?bookmark=${encodeURIComponent(restored.previous_bookmark)}`));
            toast("Restore undone");
            fill(undoArea, h("h3", {}, "Undone"), h("p", {}, "Back at the state before the restore; now at ", h("code", { class: "bookmark" }, undone.bookmark), "."));
            await drawTimeline();
          })
        : null,
    );
  }

  const bookmarkInput = h("input", { name: "bookmark", autocomplete: "off", spellcheck: "false", class: "code", required: true });
  const minuteInput = h("input", { name: "minute", type: "datetime-local", step: 60 });
  const pickers = h(
    "div",
    { class: "pickers" },
    form([field("Bookmark", bookmarkInput)], "Preview", async () => choose({ bookmark: bookmarkInput.value.trim() }), { "aria-label": "Choose a bookmark" }),
    form([field("A minute (your time zone)", minuteInput)], "Preview", async () => {
      if (!minuteInput.value) throw new Error("Pick a minute first");
      choose({ timestamp: new Date(new Date(minuteInput.value).getTime() + 59_999).toISOString() });
    }, { "aria-label": "Choose a minute" }),
  );
  await drawTimeline();
  return h("div", { class: "time-travel" }, overview, pickers, chosen, undoArea, latest);
}

function transferView(details) {
  const exportStatus = h("div", { "aria-live": "polite" });
  const exportButton = actionButton("Export as SQL", async () => {
    fill(exportStatus, h("p", { class: "muted" }, "Exporting…"));
    let answer = await v4("POST", dbPath(details.uuid, "/export"), { output_format: "polling" });
    while (answer.status !== "complete" && answer.status !== "error") {
      fill(exportStatus, h("p", { class: "muted" }, (answer.messages ?? []).join(" ") || "Exporting…"));
      await new Promise((r) => setTimeout(r, 500));
      answer = await v4("POST", dbPath(details.uuid, "/export"), { output_format: "polling", current_bookmark: answer.at_bookmark });
    }
    if (answer.status === "error") throw new Error(answer.error);
    fill(
      exportStatus,
      h("p", {}, (answer.messages ?? []).join(" "), " at bookmark ", h("code", {}, answer.at_bookmark), ". "),
      h("a", { href: sameOrigin(answer.result.signed_url), download: answer.result.filename, class: "button" }, `Download ${answer.result.filename}`),
    );
  });

  const file = h("input", { type: "file", name: "file", accept: ".sql,text/plain,application/sql", required: true });
  const importStatus = h("div", { "aria-live": "polite" });
  const importForm = can("d1:write")
    ? form([field("SQL file", file, "Run in one transaction: all of it or nothing.")], "Import", async () => {
        const chosenFile = file.files[0];
        if (!chosenFile) throw new Error("Choose a file first");
        const bar = progress("Checking the file");
        fill(importStatus, bar.el);
        const etag = await md5Hex(chosenFile, (done) => bar.set(done, chosenFile.size));
        const init = await v4("POST", dbPath(details.uuid, "/import"), { action: "init", etag });
        const upload = progress("Uploading");
        fill(importStatus, upload.el);
        await new Promise((resolve, reject) => {
          const xhr = new XMLHttpRequest();
          xhr.open("PUT", sameOrigin(init.upload_url));
          xhr.upload.onprogress = (e) => upload.set(e.loaded, chosenFile.size);
          xhr.onload = () => (xhr.status < 300 ? resolve() : reject(new Error(`upload failed: ${xhr.status}`)));
          xhr.onerror = () => reject(new Error("upload failed"));
          xhr.send(chosenFile);
        });
        upload.finish("Uploaded; running it…");
        let outcome;
        try {
          outcome = await v4("POST", dbPath(details.uuid, "/import"), { action: "ingest", etag, filename: init.filename });
          if (outcome.success === false || outcome.status === "error") throw new Error(outcome.error ?? "The import failed");
        } catch (e) {
          fill(importStatus);
          throw e;
        }
        fill(importStatus, h("p", {}, `${(outcome.messages ?? []).join(" ")}; the database is now at `, h("code", {}, outcome.at_bookmark), "."));
      }, { "aria-label": "Import SQL" })
    : h("p", { class: "muted" }, "Read-only token: imports are not allowed.");
  return h("div", { class: "transfer" }, h("h2", {}, "Export"), h("p", {}, "D1's dump format: the schema and every row, as SQL."), exportButton, exportStatus, h("h2", {}, "Import"), importForm, importStatus);
}

