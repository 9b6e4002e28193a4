// Queues: each queue's backlog, messages in flight and delayed, its oldest message's age and
// its consumer; one queue's messages as they wait (a dead-letter queue's contents), sending a
// message, purging.

import { v4, acct, can } from "./api.js";
import { h, field, form, table, heading, bytes, when, toast, actionButton, confirmAction } from "./ui.js";

function qPath(id, rest = "") {
  return acct(`/queues/${encodeURIComponent(id)}${rest}`);
}

function age(ms) {
  if (!ms) return "—";
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 120) return `${seconds} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 3600)} h`;
}

function consumerText(c) {
  if (!c) return "none";
  const dlq = c.dead_letter_queue ? ` → ${c.dead_letter_queue}` : "";
  return c.type === "worker" ? `Worker ${c.script}${dlq}` : `HTTP pull${dlq}`;
}

export async function page(parts) {
  if (parts.length === 0) return list();
  return queuePage(parts[0]);
}

async function list() {
  const all = [];
  for (let page = 1; ; page += 1) {
    const batch = await v4("GET", acct(`/queues?per_page=100&page=${page}`));
    all.push(...batch);
    if (batch.length < 100) break;
  }
  const details = await Promise.all(all.map((q) => v4("GET", qPath(q.queue_id))));
  const rows = details.map((q) => [
    h("a", { href: `#/queues/${encodeURIComponent(q.queue_id)}` }, q.queue_name),
    String(q.backlog.count),
    String(q.backlog.in_flight),
    age(q.backlog.oldest_message_timestamp_ms),
    consumerText(q.consumers[0]),
  ]);
  const name = h("input", { name: "queue_name", required: true, pattern: "[a-z0-9]([a-z0-9-]*[a-z0-9])?", spellcheck: "false" });
  const create = can("queues:write")
    ? form([field("Name", name)], "Create queue", async () => {
        const made = await v4("POST", acct("/queues"), { queue_name: name.value.trim() });
        toast(`Queue ${made.queue_name} created`);
        location.hash = `#/queues/${encodeURIComponent(made.queue_id)}`;
      }, { "aria-label": "Create a queue", class: "inline" })
    : null;
  return h(
    "section",
    {},
    heading([], "Queues"),
    h("p", { class: "muted" }, "Queues come from ", h("code", {}, "wrangler queues create"), "; consumers from ", h("code", {}, "wrangler deploy"), " or ", h("code", {}, "wrangler queues consumer"), "."),
    create,
    table(["Queue", "Backlog", "In flight", "Oldest", "Consumer"], rows, { empty: "No queues yet." }),
  );
}

async function queuePage(id) {
  const q = await v4("GET", qPath(id));
  const messages = await v4("GET", qPath(id, "/messages?limit=50"));
  const consumer = q.consumers[0];
  const facts = table(
    ["Backlog", "Bytes", "In flight", "Delayed", "Oldest", "Consumer", "Producers"],
    [[
      String(q.backlog.count),
      bytes(q.backlog.bytes),
      String(q.backlog.in_flight),
      String(q.backlog.delayed),
      age(q.backlog.oldest_message_timestamp_ms),
      consumerText(consumer),
      q.producers.map((p) => p.script).join(", ") || "none",
    ]],
  );
  const settings = consumer ? h("p", { class: "muted facts" }, Object.entries(consumer.settings).filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`).join(" · ")) : null;
  const rows = messages.map((m) => [
    h("code", {}, m.id),
    h("code", { class: "value" }, m.body.length > 200 ? `${m.body.slice(0, 200)}…` : m.body),
    m.content_type,
    String(m.attempts),
    m.in_flight ? "in flight" : m.visible_at_ms > Date.now() ? `delayed until ${when(m.visible_at_ms)}` : "waiting",
    when(m.timestamp_ms),
  ]);
  const body = h("textarea", { name: "body", rows: 2, class: "code", spellcheck: "false", required: true });
  const type = h("select", { name: "content_type" }, h("option", { value: "text" }, "text"), h("option", { value: "json" }, "json"));
  const send = can("queues:write")
    ? form([field("Body", body), field("Content type", type)], "Send message", async () => {
        const value = type.value === "json" ? JSON.parse(body.value) : body.value;
        await v4("POST", qPath(id, "/messages"), { body: value, content_type: type.value });
        toast("Sent");
        location.reload();
      }, { "aria-label": "Send a message" })
    : null;
  const actions = can("queues:write")
    ? [
        actionButton("Purge", async () => {
          if (!(await confirmAction(`Delete every message of ${q.queue_name}?`))) return;
          await v4("POST", qPath(id, "/purge"));
          toast(`${q.queue_name} purged`);
          location.reload();
        }, { class: "danger" }),
      ]
    : [];
  return h(
    "section",
    {},
    heading([["Queues", "#/queues"]], q.queue_name, ...actions),
    h("p", { class: "muted facts" }, q.queue_id),
    facts,
    settings,
    h("h2", {}, "Messages, oldest first"),
    table(["Id", "Body", "Type", "Attempts", "State", "Sent"], rows, { empty: "The queue is empty." }),
    send,
  );
}
