// A producer and consumer Worker, as the Queues guides write one. Every delivery is recorded
// in D1 (queue, message id, body, attempts, when it was sent and delivered), so what arrived
// can be compared with what was sent.

const SCHEMA = `CREATE TABLE IF NOT EXISTS deliveries (
  queue TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL, attempts INTEGER NOT NULL,
  sent_ms INTEGER NOT NULL, delivered_ms INTEGER NOT NULL)`;

function describe(body) {
  if (body instanceof ArrayBuffer) return { bytes: [...new Uint8Array(body)] };
  if (body instanceof Map) return { map: [...body] };
  return body;
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const params = url.searchParams;
    try {
      switch (url.pathname) {
        case "/setup":
          await env.DB.exec(SCHEMA.replaceAll("\n", " "));
          return Response.json({ ok: true });
        case "/send-many": {
          // n JSON messages {seq}, through sendBatch in batches of 100.
          const n = Number(params.get("n"));
          const from = Number(params.get("from") ?? 0);
          for (let start = 0; start < n; start += 100) {
            const batch = [];
            for (let i = start; i < Math.min(n, start + 100); i++) batch.push({ body: { seq: from + i } });
            await env.JOBS.sendBatch(batch);
          }
          return Response.json({ sent: n });
        }
        case "/send": {
          // One message: the body's JSON from the query, with options.
          const body = JSON.parse(params.get("body"));
          const options = {};
          if (params.has("delay")) options.delaySeconds = Number(params.get("delay"));
          await env.JOBS.send(body, options);
          return Response.json({ ok: true });
        }
        case "/send-types": {
          await env.JOBS.send("plain text", { contentType: "text" });
          await env.JOBS.send(new Uint8Array([1, 2, 3]), { contentType: "bytes" });
          await env.JOBS.send({ nested: [1, "two"] }, { contentType: "json" });
          await env.JOBS.send(new Map([["k", 1]]), { contentType: "v8" });
          return Response.json({ ok: true });
        }
        case "/send-large": {
          const n = Number(params.get("bytes"));
          await env.JOBS.send("x".repeat(n), { contentType: "text" });
          return Response.json({ ok: true });
        }
        case "/metrics":
          return Response.json(await env.JOBS.metrics());
        case "/deliveries": {
          const { results } = await env.DB.prepare("SELECT queue, id, body, attempts, sent_ms, delivered_ms FROM deliveries ORDER BY rowid").all();
          return Response.json(results);
        }
      }
      return new Response("not found", { status: 404 });
    } catch (e) {
      return Response.json({ error: e.message }, { status: 400 });
    }
  },

  async queue(batch, env) {
    const now = Date.now();
    const record = env.DB.prepare("INSERT INTO deliveries (queue, id, body, attempts, sent_ms, delivered_ms) VALUES (?, ?, ?, ?, ?, ?)");
    await env.DB.batch(
      batch.messages.map((m) => record.bind(batch.queue, m.id, JSON.stringify(describe(m.body) ?? null) ?? "null", m.attempts, m.timestamp.getTime(), now)),
    );
    if (batch.queue === "jobs-dlq") return; // returning acknowledges the batch
    // The work a consumer does with a batch, which takes time: kills land while batches run.
    if (batch.messages.some((m) => m.body && m.body.seq !== undefined)) await new Promise((r) => setTimeout(r, 150));
    for (const message of batch.messages) {
      const body = message.body;
      if (body && body.poison) {
        message.retry();
      } else if (body && body.failTimes && message.attempts <= body.failTimes) {
        message.retry({ delaySeconds: body.retryDelay ?? 0 });
      } else if (body && body.throwBatch && message.attempts === 1) {
        throw new Error("a batch that fails once");
      } else {
        message.ack();
      }
    }
  },
};
