const SCHEMA = [
  "CREATE TABLE IF NOT EXISTS tasks (id INTEGER PRIMARY KEY, payload TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'queued', claimed_by TEXT, claim_token INTEGER NOT NULL DEFAULT 0, lease_until INTEGER, result TEXT, completions INTEGER NOT NULL DEFAULT 0)",
  "CREATE TABLE IF NOT EXISTS photos (key TEXT PRIMARY KEY)",
  "CREATE TABLE IF NOT EXISTS runs (cron TEXT NOT NULL, scheduled INTEGER NOT NULL, claimed INTEGER NOT NULL, reclaimed INTEGER NOT NULL)",
];
const LEASE_MS = 60_000;
const PER_RUN = 3;

async function schema(db) {
  await db.batch(SCHEMA.map((sql) => db.prepare(sql)));
}

// Claims the oldest task that is queued or whose lease ran out: the claim bumps its fencing
// token, which the completion must present.
function claim(db, worker, now) {
  return db
    .prepare(
      `UPDATE tasks SET state = 'claimed', claimed_by = ?1, claim_token = claim_token + 1, lease_until = ?2
       WHERE id = (SELECT id FROM tasks WHERE state = 'queued' OR (state = 'claimed' AND lease_until < ?3) ORDER BY id LIMIT 1)
       RETURNING id, payload, claim_token`,
    )
    .bind(worker, now + LEASE_MS, now)
    .first();
}

// Completes a task only under the token it was claimed with: a holder whose lease was taken
// over changes nothing.
async function complete(db, id, token, result) {
  const done = await db
    .prepare("UPDATE tasks SET state = 'done', result = ?1, completions = completions + 1 WHERE id = ?2 AND claim_token = ?3 AND state = 'claimed'")
    .bind(result, id, token)
    .run();
  return done.meta.changes;
}

// Deletes the bucket's objects no photo row references, two keys a page.
async function reclaim(env) {
  let reclaimed = 0;
  let cursor;
  do {
    const page = await env.FILES.list({ limit: 2, cursor });
    for (const object of page.objects) {
      const referenced = await env.DB.prepare("SELECT 1 FROM photos WHERE key = ?").bind(object.key).first();
      if (!referenced) {
        await env.FILES.delete(object.key);
        reclaimed++;
      }
    }
    cursor = page.truncated ? page.cursor : undefined;
  } while (cursor);
  return reclaimed;
}

export default {
  async scheduled(controller, env, ctx) {
    await schema(env.DB);
    let claimed = 0;
    for (let i = 0; i < PER_RUN; i++) {
      const task = await claim(env.DB, `cron@${controller.scheduledTime}`, Date.now());
      if (!task) break;
      claimed += await complete(env.DB, task.id, task.claim_token, `done: ${task.payload}`);
    }
    const reclaimed = await reclaim(env);
    ctx.waitUntil(
      env.DB.prepare("INSERT INTO runs (cron, scheduled, claimed, reclaimed) VALUES (?, ?, ?, ?)")
        .bind(controller.cron, controller.scheduledTime, claimed, reclaimed)
        .run(),
    );
  },

  async fetch(request, env) {
    await schema(env.DB);
    const url = new URL(request.url);
    const n = Number(url.searchParams.get("n") ?? 0);
    if (url.pathname === "/enqueue") {
      for (let i = 0; i < n; i++) {
        await env.DB.prepare("INSERT INTO tasks (payload) VALUES (?)").bind(`task ${crypto.randomUUID()}`).run();
      }
      return Response.json({ enqueued: n });
    }
    if (url.pathname === "/files") {
      // Photos whose rows exist, and blobs whose row never got written (orphans).
      for (let i = 0; i < n; i++) {
        await env.FILES.put(`kept/${i}`, `kept ${i}`);
        await env.DB.prepare("INSERT OR IGNORE INTO photos (key) VALUES (?)").bind(`kept/${i}`).run();
        await env.FILES.put(`orphan/${i}`, `orphan ${i}`);
      }
      return Response.json({ files: 2 * n });
    }
    if (url.pathname === "/stale") {
      // A holder that died: its lease ran out long ago; the next claim takes the task over.
      await env.DB.prepare("INSERT INTO tasks (payload, state, claimed_by, claim_token, lease_until) VALUES ('stale', 'claimed', 'dead', 1, 0)").run();
      return Response.json({ stale: 1 });
    }
    if (url.pathname === "/late-completion") {
      // The dead holder wakes up and completes under its old token.
      const id = Number(url.searchParams.get("id"));
      return Response.json({ changes: await complete(env.DB, id, 1, "late") });
    }
    const tasks = (await env.DB.prepare("SELECT id, payload, state, claimed_by, claim_token, result, completions FROM tasks ORDER BY id").all()).results;
    const runs = (await env.DB.prepare("SELECT cron, scheduled, claimed, reclaimed FROM runs ORDER BY rowid").all()).results;
    const objects = [];
    let cursor;
    do {
      const page = await env.FILES.list({ cursor });
      objects.push(...page.objects.map((o) => o.key));
      cursor = page.truncated ? page.cursor : undefined;
    } while (cursor);
    return Response.json({ tasks, runs, objects });
  },
};
