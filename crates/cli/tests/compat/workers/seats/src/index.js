// Seat booking on D1. A booking reads the event's version, then updates it only if nobody
// else has since (`WHERE id = ? AND version = ? AND available > 0`) and checks
// `meta.changes`: 0 means someone else won, so it reads again and retries. Claims are
// idempotent: `INSERT … ON CONFLICT(idempotency_key) DO NOTHING` claims a key once.
const json = (value, status = 200) => Response.json(value, { status });

async function setup(env, seats) {
  await env.DB.batch([
    env.DB.prepare(
      "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, available INTEGER NOT NULL, version INTEGER NOT NULL DEFAULT 0)",
    ),
    env.DB.prepare("CREATE TABLE IF NOT EXISTS bookings (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id INTEGER NOT NULL, who TEXT NOT NULL)"),
    env.DB.prepare("CREATE TABLE IF NOT EXISTS claims (idempotency_key TEXT PRIMARY KEY, who TEXT NOT NULL)"),
    env.DB.prepare("DELETE FROM bookings"),
    env.DB.prepare("DELETE FROM claims"),
    env.DB.prepare("INSERT OR REPLACE INTO events (id, available, version) VALUES (1, ?, 0)").bind(seats),
  ]);
}

async function book(env, who) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const event = await env.DB.prepare("SELECT available, version FROM events WHERE id = ?").bind(1).first();
    if (event.available <= 0) return json({ booked: false, reason: "sold out" }, 409);
    const { meta } = await env.DB.prepare(
      "UPDATE events SET available = available - 1, version = version + 1 WHERE id = ? AND version = ? AND available > 0",
    )
      .bind(1, event.version)
      .run();
    if (meta.changes === 1) {
      await env.DB.prepare("INSERT INTO bookings (event_id, who) VALUES (?, ?)").bind(1, who).run();
      return json({ booked: true, attempts: attempt + 1 });
    }
  }
  return json({ booked: false, reason: "too much contention" }, 503);
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const who = url.searchParams.get("who") ?? "anonymous";
    switch (url.pathname) {
      case "/setup":
        await setup(env, Number(url.searchParams.get("seats") ?? 10));
        return json({ ok: true });
      case "/book":
        return book(env, who);
      case "/claim": {
        const key = url.searchParams.get("key");
        const { meta } = await env.DB.prepare(
          "INSERT INTO claims (idempotency_key, who) VALUES (?, ?) ON CONFLICT(idempotency_key) DO NOTHING",
        )
          .bind(key, who)
          .run();
        return json({ claimed: meta.changes === 1 });
      }
      case "/state": {
        const event = await env.DB.prepare("SELECT available, version FROM events WHERE id = 1").first();
        const bookings = await env.DB.prepare("SELECT count(*) AS n FROM bookings").first("n");
        const claims = await env.DB.prepare("SELECT idempotency_key AS key, who FROM claims ORDER BY key").all();
        return json({ event, bookings, claims: claims.results });
      }
      case "/config":
        return json({ greeting: env.GREETING, apiKey: env.API_KEY ?? null, keys: Object.keys(env).sort() });
      case "/throw":
        console.log("about to throw for", who);
        throw new Error(`kaboom for ${who}`);
      default:
        return new Response("not found", { status: 404 });
    }
  },
};
