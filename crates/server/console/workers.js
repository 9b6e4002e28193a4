// Workers: the deployed scripts; per Worker its Cron Triggers, its recent logs (console output,
// exceptions, failures, every cron run) and a live log streamed from a tail, the same stream
// `wrangler tail` reads.

import { v4, acct } from "./api.js";
import { h, fill, table, heading, when, errorBox } from "./ui.js";

function scriptPath(name, rest = "") {
  return acct(`/workers/scripts/${encodeURIComponent(name)}${rest}`);
}

export async function page(parts) {
  if (parts.length === 0) return scripts();
  return worker(parts[0]);
}

async function scripts() {
  const list = await v4("GET", acct("/workers/scripts"));
  return h(
    "section",
    {},
    heading([], "Workers"),
    h("p", { class: "muted" }, "Deployed with ", h("code", {}, "wrangler deploy"), "; served on kura's Workers listener by host name."),
    table(
      ["Name", "Created", "Modified"],
      list.map((s) => [h("a", { href: `#/workers/${encodeURIComponent(s.id)}` }, s.id), when(s.created_on), when(s.modified_on)]),
      { empty: "No Workers deployed yet." },
    ),
  );
}

/** What caused an event: the request, the cron run, or whatever else workerd traced. */
export function describe(event) {
  const cause = event.event ?? {};
  if (cause.request) return `${cause.request.method} ${cause.request.url}`;
  if (cause.cron !== undefined) return `"${cause.cron}" @ ${new Date(cause.scheduledTime).toISOString()}`;
  if (cause.type === "overload") return cause.message;
  return "(invocation)";
}

function lines(event) {
  const logged = (event.logs ?? []).map((l) => `(${l.level}) ${l.message.map((m) => (typeof m === "string" ? m : JSON.stringify(m))).join(" ")}`);
  const thrown = (event.exceptions ?? []).map((e) => `${e.name}: ${e.message}`);
  return [...logged, ...thrown].join("\n");
}

function eventRow(event) {
  return [when(new Date(event.eventTimestamp).toISOString()), describe(event), event.outcome ?? "", h("pre", { class: "log" }, lines(event))];
}

async function worker(name) {
  const [schedules, logs] = await Promise.all([
    v4("GET", scriptPath(name, "/schedules")),
    v4("GET", scriptPath(name, "/logs")),
  ]);
  const crons = schedules.schedules ?? [];
  const live = h("tbody", {});
  const status = h("p", { class: "muted", role: "status" }, "Not streaming.");
  let socket = null;
  let tailId = null;
  const stop = async () => {
    socket?.close();
    socket = null;
    if (tailId) {
      const id = tailId;
      tailId = null;
      await v4("DELETE", scriptPath(name, `/tails/${id}`)).catch(() => {});
    }
    toggle.textContent = "Start live log";
    fill(status, "Not streaming.");
  };
  const start = async () => {
    try {
      const tail = await v4("POST", scriptPath(name, "/tails"), { filters: [] });
      tailId = tail.id;
      socket = new WebSocket(tail.url, "trace-v1");
      socket.onopen = () => fill(status, `Streaming every invocation of ${name} as it happens.`);
      socket.onmessage = (message) => {
        const row = h("tr", {}, ...eventRow(JSON.parse(message.data)).map((cell) => h("td", {}, cell)));
        live.prepend(row);
        while (live.children.length > 200) live.lastChild.remove();
      };
      socket.onclose = () => {
        if (socket) stop();
      };
      toggle.textContent = "Stop live log";
    } catch (e) {
      fill(status, errorBox(e));
    }
  };
  const toggle = h("button", { type: "button", onclick: () => (socket ? stop() : start()) }, "Start live log");
  // Leaving the page ends the tail.
  window.addEventListener("hashchange", stop, { once: true });
  return h(
    "section",
    {},
    heading([["Workers", "#/workers"]], name),
    h("h2", {}, "Cron Triggers"),
    crons.length
      ? table(["Schedule", "Since"], crons.map((c) => [h("code", {}, c.cron), when(c.created_on)]))
      : h("p", { class: "muted" }, "No schedules."),
    h("h2", {}, "Live log"),
    h("div", { class: "actions" }, toggle),
    status,
    h("table", { "aria-label": "Live log" }, h("thead", {}, h("tr", {}, ...["Time", "Event", "Outcome", "Logs"].map((c) => h("th", { scope: "col" }, c)))), live),
    h("h2", {}, "Recent logs and cron runs"),
    table(["Time", "Event", "Outcome", "Logs"], logs.slice().reverse().slice(0, 100).map(eventRow), { empty: "Nothing logged yet." }),
  );
}
