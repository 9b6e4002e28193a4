// The console's building blocks. Everything is made with DOM calls and text nodes, never from
// HTML strings, so a table name, an object key or a metadata value is always shown as text.

/** An element: h("button", {onclick, class: "x"}, "text", child, [more]). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let fieldCount = 0;
/** A labelled form field: the input gets an id its label points at. */
export function field(label, input, hint) {
  const id = input.id || `f${++fieldCount}`;
  input.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), input, hint ? h("small", { class: "muted" }, hint) : null);
}

/** A table of rows; `columns` are header texts, cells are text or nodes. */
export function table(columns, rows, { caption, empty = "Nothing here yet." } = {}) {
  if (rows.length === 0) return h("p", { class: "muted empty" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, cellValue(c)))))),
    ),
  );
}

/** A value from SQL shown as text: NULL marked, bytes as hex, long text cut. */
export function cellValue(value) {
  if (value instanceof Node) return value;
  if (value === null) return h("span", { class: "null" }, "NULL");
  if (Array.isArray(value)) return h("span", { class: "blob" }, `x'${value.map((b) => b.toString(16).padStart(2, "0")).join("")}'`);
  const text = typeof value === "object" ? JSON.stringify(value) : String(value);
  return text.length > 300 ? h("span", { title: text }, `${text.slice(0, 300)}…`) : text;
}

/** A short message at the bottom of the screen. */
export function toast(message, kind = "info") {
  const el = h("div", { class: `toast ${kind}` }, message);
  const shelf = document.getElementById("toasts");
  shelf.append(el);
  while (shelf.childElementCount > 3) shelf.firstElementChild.remove();
  setTimeout(() => el.remove(), kind === "error" ? 8000 : 4000);
}

/** An error box, as the API worded it; a refusal says it is about this token's reach. */
export function errorBox(error) {
  const message = error?.message ?? String(error);
  const refused = error?.status === 403 ? "This token may not do that: " : "";
  return h("div", { class: "error", role: "alert" }, refused, message);
}

/** Asks before doing something that cannot be undone. */
export function confirmAction(question) {
  return window.confirm(question);
}

/** A progress bar with a label; `set(done, total)` moves it. */
export function progress(label) {
  const bar = h("progress", { max: 1, value: 0 });
  const text = h("span", { class: "muted" }, "0%");
  const el = h("div", { class: "progress" }, h("label", {}, label, " ", bar), " ", text);
  return {
    el,
    set(done, total) {
      bar.max = Math.max(total, 1);
      bar.value = done;
      text.textContent = `${total ? Math.floor((100 * done) / total) : 100}% (${bytes(done)} of ${bytes(total)})`;
    },
    finish(message) {
      bar.value = bar.max;
      text.textContent = message;
    },
  };
}

/** Bytes for people. */
export function bytes(n) {
  const value = Number(n ?? 0);
  if (value < 1024) return `${value} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = value / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

/** A time for people, in the browser's zone. */
export function when(value) {
  if (value === undefined || value === null || value === "") return "";
  const date = typeof value === "number" ? new Date(value) : new Date(String(value));
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
}

/** A button that shows it is busy while `action` runs, and shows its error if it fails. */
export function actionButton(label, action, attrs = {}) {
  const button = h("button", { type: "button", ...attrs }, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await action();
    } catch (e) {
      toast(e.message ?? String(e), "error");
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

/** A form whose submit runs `action` with the form's values, with its errors shown in it. */
export function form(children, submitLabel, action, attrs = {}) {
  const status = h("div", { class: "form-status" });
  const submit = h("button", { type: "submit", class: "primary" }, submitLabel);
  const el = h("form", attrs, children, h("div", { class: "actions" }, submit), status);
  el.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    fill(status);
    try {
      await action(el, status);
    } catch (e) {
      fill(status, errorBox(e));
    } finally {
      submit.disabled = false;
    }
  });
  return el;
}

/** Page heading with a trail of links back up. */
export function heading(trail, title, ...actions) {
  return h(
    "div",
    { class: "page-head" },
    trail.length ? h("nav", { class: "trail", "aria-label": "Breadcrumb" }, trail.map(([text, href]) => [h("a", { href }, text), " / "])) : null,
    h("h1", {}, title),
    actions.length ? h("div", { class: "head-actions" }, actions) : null,
  );
}

/** Tabs as links: the current one marked. */
export function tabs(items, current) {
  return h(
    "nav",
    { class: "tabs", "aria-label": "Views" },
    items.map(([key, text, href]) => h("a", { href, "aria-current": key === current ? "page" : null }, text)),
  );
}

/** Saves bytes as a file the browser downloads. */
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
