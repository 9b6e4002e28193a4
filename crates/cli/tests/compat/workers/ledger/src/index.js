// A ledger on D1, R2, KV and a queue with a Cron Trigger, for the cluster tests. A binding call that fails
// with a promise that nothing happened (kura's "retry shortly", "did not take effect") is
// answered 503, so a client knows to retry; any other failure is answered 500.
const json = (value, status = 200) => Response.json(value, { status });
const NOTHING_HAPPENED = /retry shortly|did not take effect|unavailable for now/;
const SCHEMA = [
  "CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY)",
  "CREATE TABLE IF NOT EXISTS runs (scheduled INTEGER NOT NULL, cron TEXT NOT NULL)",
  "CREATE TABLE IF NOT EXISTS deliveries (id INTEGER NOT NULL)",
];

async function handle(request, env) {
  const url = new URL(request.url);
  const [, what, key] = url.pathname.match(/^\/([a-z]+)\/?(.*)$/) ?? [];
  if (what === "setup") {
    await env.DB.batch(SCHEMA.map((sql) => env.DB.prepare(sql)));
    return json({ ok: true });
  }
  if (what === "entries" && request.method === "POST") {
    await env.DB.prepare("INSERT INTO entries (id) VALUES (?)").bind(Number(key)).run();
    return json({ id: Number(key) });
  }
  if (what === "entries") {
    const { results } = await env.DB.prepare("SELECT id FROM entries ORDER BY id").all();
    return json(results.map((r) => r.id));
  }
  if (what === "session") {
    // A Sessions read: from a read replica where the database's replication is on.
    const session = env.DB.withSession(url.searchParams.get("bookmark") ?? "first-unconstrained");
    const { results, meta } = await session.prepare("SELECT count(*) AS n FROM entries").all();
    const { served_by_primary, served_by_region } = meta;
    return json({ n: results[0].n, served_by_primary, served_by_region, bookmark: session.getBookmark() });
  }
  if (what === "runs") {
    const { results } = await env.DB.prepare("SELECT scheduled, cron FROM runs ORDER BY rowid").all();
    return json(results);
  }
  if (what === "files" && request.method === "PUT") {
    const put = await env.FILES.put(key, request.body);
    return json({ key: put.key, size: put.size, etag: put.etag });
  }
  if (what === "files") {
    const object = await env.FILES.get(key);
    return object ? new Response(object.body, { headers: { etag: object.httpEtag } }) : json(null, 404);
  }
  if (what === "notes" && request.method === "PUT") {
    await env.NOTES.put(key, await request.text(), { metadata: { by: "ledger" } });
    return json({ key });
  }
  if (what === "notes") {
    const { value, metadata } = await env.NOTES.getWithMetadata(key);
    return value === null ? json(null, 404) : json({ value, metadata });
  }
  if (what === "jobs" && request.method === "POST") {
    await env.JOBS.send({ id: Number(key) }, { delaySeconds: Number(url.searchParams.get("delay") ?? 0) });
    return json({ id: Number(key) });
  }
  if (what === "jobs") {
    const { results } = await env.DB.prepare("SELECT id FROM deliveries ORDER BY rowid").all();
    return json(results.map((r) => r.id));
  }
  if (what === "greeting") return json({ greeting: env.GREETING, secret: env.SECRET ?? null });
  return new Response("not found", { status: 404 });
}

export default {
  async fetch(request, env) {
    try {
      return await handle(request, env);
    } catch (e) {
      const said = String(e?.message ?? e);
      return json({ error: said }, NOTHING_HAPPENED.test(said) ? 503 : 500);
    }
  },

  // Each delivery is recorded, duplicates included; a batch that cannot be recorded is retried.
  async queue(batch, env) {
    const insert = env.DB.prepare("INSERT INTO deliveries (id) VALUES (?)");
    await env.DB.batch(batch.messages.map((m) => insert.bind(m.body.id)));
  },

  // A run that meets its database moving to another node retries, as a job should.
  async scheduled(controller, env) {
    const insert = env.DB.prepare("INSERT INTO runs (scheduled, cron) VALUES (?, ?)");
    for (let attempt = 1; ; attempt++) {
      try {
        await insert.bind(controller.scheduledTime, controller.cron).run();
        return;
      } catch (e) {
        if (attempt >= 30 || !NOTHING_HAPPENED.test(String(e?.message ?? e))) throw e;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  },
};
