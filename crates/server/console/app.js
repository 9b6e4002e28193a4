// The console's shell: sign-in, navigation and the hash router that hands each page to its
// section (d1.js, r2.js, kv.js, queues.js, do.js, workers.js, tokens.js).

import { session, signIn, forget, can, v4, acct } from "./api.js";
import { h, fill, field, form, heading, table, when, errorBox } from "./ui.js";
import * as d1 from "./d1.js";
import * as r2 from "./r2.js";
import * as kv from "./kv.js";
import * as queues from "./queues.js";
import * as durable from "./do.js";
import * as tokens from "./tokens.js";
import * as workers from "./workers.js";

const main = document.getElementById("main");

const SECTIONS = [
  ["d1", "D1", () => can("d1:read")],
  ["r2", "R2", () => can("r2:read")],
  ["kv", "KV", () => can("kv:read")],
  ["queues", "Queues", () => can("queues:read")],
  ["do", "Durable Objects", () => can("do:read")],
  ["workers", "Workers", () => can("admin") && session.config?.workers],
  ["tokens", "API tokens", () => can("admin")],
];

let drawnFor = null;
function renderNav(current) {
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  if (!session.tokenInfo) {
    fill(nav);
    fill(who);
    drawnFor = null;
    return;
  }
  // Drawn once per sign-in; later only the current section moves, so focus stays where it is.
  if (drawnFor === session.tokenInfo.id) {
    for (const a of nav.querySelectorAll("a")) {
      if (a.getAttribute("href") === `#/${current}`) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    return;
  }
  drawnFor = session.tokenInfo.id;
  fill(
    nav,
    h(
      "ul",
      {},
      SECTIONS.filter(([, , allowed]) => allowed()).map(([key, label]) =>
        h("li", {}, h("a", { href: `#/${key}`, "aria-current": key === current ? "page" : null }, label)),
      ),
    ),
  );
  const readOnly = session.tokenInfo.scope.endsWith(":read");
  fill(
    who,
    h("span", { class: "account", title: session.account.id }, session.account.name),
    h("span", { class: `scope${readOnly ? " read-only" : ""}` }, readOnly ? `${session.tokenInfo.scope} · read-only` : session.tokenInfo.scope),
    h("button", { type: "button", class: "link", onclick: () => { forget(); sessionStorage.clear(); location.hash = "#/"; route(); } }, "Sign out"),
  );
}

function signInPage() {
  const input = h("input", { type: "password", name: "token", autocomplete: "off", required: true, spellcheck: "false" });
  return h(
    "section",
    { class: "signin" },
    h("h1", {}, "Sign in to kura"),
    h("p", {}, "Use an API token of your account: the admin token ", h("code", {}, "kura serve"), " printed, or one from ", h("code", {}, "kura tokens create"), ". It stays in this browser tab only."),
    form([field("API token", input)], "Sign in", async () => {
      try {
        await signIn(input.value.trim());
      } catch (e) {
        throw e.status === 401 || e.status === 403 ? new Error(`The token was refused: ${e.message}`) : e;
      }
      await route();
      main.focus({ preventScroll: true });
    }, { "aria-label": "Sign in" }),
  );
}

function home() {
  const first = SECTIONS.find(([, , allowed]) => allowed());
  if (first) location.replace(`#/${first[0]}`);
  return h("p", {}, "This token reaches nothing the console shows.");
}

/** `#/section/part/part?query` split into its pieces. */
function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, query: new URLSearchParams(query) };
}

let routing = 0;
export async function route() {
  const mine = ++routing;
  if (session.token && !session.tokenInfo) {
    try {
      await signIn(session.token);
    } catch {
      forget();
    }
  }
  const { parts, query } = parseHash();
  renderNav(parts[0]);
  if (!session.tokenInfo) {
    fill(main, signInPage());
    main.querySelector("input")?.focus();
    return;
  }
  fill(main, h("p", { class: "muted", "aria-busy": "true" }, "Loading…"));
  let page;
  try {
    switch (parts[0]) {
      case "d1":
        page = await d1.page(parts.slice(1), query);
        break;
      case "r2":
        page = await r2.page(parts.slice(1), query);
        break;
      case "kv":
        page = await kv.page(parts.slice(1), query);
        break;
      case "queues":
        page = await queues.page(parts.slice(1));
        break;
      case "do":
        page = await durable.page(parts.slice(1), query);
        break;
      case "tokens":
        page = await tokens.page();
        break;
      case "workers":
        page = await workers.page(parts.slice(1));
        break;
      default:
        page = home();
    }
  } catch (e) {
    page = h("section", {}, h("h1", {}, "Something went wrong"), errorBox(e));
  }
  if (mine !== routing) return;
  fill(main, page);
  document.title = `${main.querySelector("h1")?.textContent ?? "kura"} · kura console`;
}

// The skip link moves focus to the content; it must not change the route.
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});

window.addEventListener("hashchange", async () => {
  await route();
  // A new page: keyboard and screen-reader users start at its top, as after a page load.
  if (!main.contains(document.activeElement)) main.focus({ preventScroll: true });
});
route();
