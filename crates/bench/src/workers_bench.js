// The benchmark's Worker, the same on both sides: each request does one thing. Deployed with a
// static asset, `/asset.txt` (4 KiB), which both sides serve before the Worker.
import { DurableObject } from "cloudflare:workers";

export class Room extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS member (user_id TEXT PRIMARY KEY)");
  }
  add(user) {
    this.ctx.storage.sql.exec("INSERT OR IGNORE INTO member (user_id) VALUES (?)", user);
    return 1;
  }
}

const KV_VALUE = "v".repeat(1024);

export default {
  // The consumer of the queue `bench-q`: per batch, how many messages and how long each took
  // from its send (the time in its body) to this delivery.
  async queue(batch, env) {
    const now = Date.now();
    const delays = batch.messages.map((m) => now - m.body.t);
    await env.DB.prepare("INSERT INTO qstats (run, n, delays) VALUES (?, ?, ?)").bind(batch.messages[0].body.run, batch.messages.length, JSON.stringify(delays)).run();
  },

  // Records how late it started (Date.now() is the time the invocation began).
  async scheduled(controller, env) {
    await env.DB.prepare("INSERT INTO lateness (ms) VALUES (?)").bind(Date.now() - controller.scheduledTime).run();
  },

  async fetch(request, env) {
    const url = new URL(request.url);
    const i = Number(url.searchParams.get("i") ?? 0);
    switch (url.pathname) {
      case "/const":
        return new Response("ok");
      case "/d1":
        return Response.json(await env.DB.prepare("SELECT * FROM kv WHERE id = ?").bind(i % 1000).first());
      case "/r2": {
        const object = await env.FILES.get("k/" + (i % 100));
        return new Response(object.body);
      }
      case "/kv":
        return new Response(await env.CACHE.get("k/" + (i % 100), "arrayBuffer"));
      case "/kv-put":
        await env.CACHE.put("w/" + (i % 1000), KV_VALUE);
        return new Response("ok");
      case "/q-send": {
        // A batch of `n` messages of run `run`.
        const n = Number(url.searchParams.get("n") ?? 100);
        const run = url.searchParams.get("run");
        const t = Date.now();
        await env.Q.sendBatch(Array.from({ length: n }, (_, k) => ({ body: { run, k, t } })));
        return new Response("sent");
      }
      case "/q-stats": {
        const rows = (await env.DB.prepare("SELECT n, delays FROM qstats WHERE run = ?").bind(url.searchParams.get("run")).all()).results;
        return Response.json({ delivered: rows.reduce((a, r) => a + r.n, 0), delays: rows.flatMap((r) => JSON.parse(r.delays)) });
      }
      case "/do":
        return Response.json(await env.ROOMS.getByName("room:" + (i % 1000)).add("u" + i));
      case "/lateness": {
        // How late each scheduled run started after its scheduled time, in ms.
        const { results } = await env.DB.prepare("SELECT ms FROM lateness ORDER BY rowid").all();
        return Response.json(results.map((r) => r.ms));
      }
      case "/setup": {
        await env.DB.exec("CREATE TABLE IF NOT EXISTS lateness (ms INTEGER NOT NULL)");
        await env.DB.exec("CREATE TABLE IF NOT EXISTS qstats (run TEXT NOT NULL, n INTEGER NOT NULL, delays TEXT NOT NULL)");
        await env.DB.exec("CREATE TABLE IF NOT EXISTS kv (id INTEGER PRIMARY KEY, v TEXT)");
        const rows = [];
        for (let k = 0; k < 1000; k++) rows.push(env.DB.prepare("INSERT OR REPLACE INTO kv (id, v) VALUES (?, ?)").bind(k, "value-" + k));
        await env.DB.batch(rows);
        const value = new Uint8Array(1024).fill(7);
        await Promise.all(Array.from({ length: 100 }, (_, k) => env.FILES.put("k/" + k, value)));
        await Promise.all(Array.from({ length: 100 }, (_, k) => env.CACHE.put("k/" + k, value)));
        return new Response("ready");
      }
      default:
        return new Response("not found", { status: 404 });
    }
  },
};
