// Photo uploads on R2 and D1.
//
// - POST /uploads?type=…: a presigned PUT (aws4fetch, signQuery + allHeaders, 300 s) whose
//   signature covers the content type, and a pending row.
// - POST /uploads/<id>/done: the blob must be in the bucket before the row says "ready".
// - POST /reclaim: pages through list() with cursors and deletes photos/<uuid> blobs no row
//   references; other keys are left alone.
// - Content-addressed blobs (blob_refs): a reference claims the blob before it counts, and
//   reclaim claims a blob for deletion before deleting it, so a reference made during a
//   reclaim always keeps (or restores) the blob.
import { AwsClient } from "aws4fetch";

const json = (value, status = 200) => Response.json(value, { status });
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

async function sha256(bytes) {
  return [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function setup(env) {
  await env.DB.batch([
    env.DB.prepare("CREATE TABLE IF NOT EXISTS photos (id TEXT PRIMARY KEY, key TEXT NOT NULL, type TEXT NOT NULL, status TEXT NOT NULL)"),
    env.DB.prepare("CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, refs INTEGER NOT NULL, state TEXT NOT NULL)"),
    env.DB.prepare("CREATE TABLE IF NOT EXISTS blob_refs (ref TEXT PRIMARY KEY, hash TEXT NOT NULL)"),
  ]);
}

async function presign(env, type) {
  const id = crypto.randomUUID();
  const key = `photos/${id}`;
  const aws = new AwsClient({
    accessKeyId: env.S3_ACCESS_KEY_ID,
    secretAccessKey: env.S3_SECRET_ACCESS_KEY,
    service: "s3",
    region: "auto",
  });
  const target = new URL(`${env.S3_ENDPOINT}/${env.BUCKET_NAME}/${key}`);
  target.searchParams.set("X-Amz-Expires", "300");
  const signed = await aws.sign(new Request(target, { method: "PUT", headers: { "Content-Type": type } }), {
    aws: { signQuery: true, allHeaders: true },
  });
  await env.DB.prepare("INSERT INTO photos (id, key, type, status) VALUES (?, ?, ?, 'pending')").bind(id, key, type).run();
  return { id, key, url: signed.url };
}

async function finish(env, id) {
  const photo = await env.DB.prepare("SELECT key FROM photos WHERE id = ?").bind(id).first();
  if (!photo) return json({ error: "no such upload" }, 404);
  const blob = await env.PHOTOS.head(photo.key);
  if (!blob) return json({ ready: false, reason: "the blob is not uploaded" }, 409);
  await env.DB.prepare("UPDATE photos SET status = 'ready' WHERE id = ?").bind(id).run();
  return json({ ready: true, size: blob.size, type: blob.httpMetadata.contentType, etag: blob.etag });
}

async function reclaim(env) {
  const referenced = new Set((await env.DB.prepare("SELECT key FROM photos").all()).results.map((r) => r.key));
  let cursor;
  let pages = 0;
  let listed = 0;
  const doomed = [];
  do {
    const page = await env.PHOTOS.list({ prefix: "photos/", cursor, limit: 1000 });
    pages++;
    listed += page.objects.length;
    for (const object of page.objects) {
      const name = object.key.slice("photos/".length);
      if (UUID.test(name) && !referenced.has(object.key)) doomed.push(object.key);
    }
    cursor = page.truncated ? page.cursor : undefined;
  } while (cursor);
  for (let i = 0; i < doomed.length; i += 1000) await env.PHOTOS.delete(doomed.slice(i, i + 1000));
  return { pages, listed, deleted: doomed.length };
}

async function seed(env, count, referenced) {
  const keys = [];
  for (let i = 0; i < count; i += 50) {
    const batch = [];
    for (let j = i; j < Math.min(count, i + 50); j++) {
      const id = crypto.randomUUID();
      const key = `photos/${id}`;
      keys.push(key);
      batch.push(env.PHOTOS.put(key, `photo ${j}`, { httpMetadata: { contentType: "image/png" } }));
      if (j < referenced) {
        batch.push(env.DB.prepare("INSERT INTO photos (id, key, type, status) VALUES (?, ?, 'image/png', 'ready')").bind(id, key).run());
      }
    }
    await Promise.all(batch);
  }
  // Not a photo: reclaim leaves keys that are not UUIDs alone.
  await env.PHOTOS.put("photos/README.txt", "how photos are stored");
  return { keys: keys.length };
}

// A new reference to a content-addressed blob claims it in D1 before it counts: refs + 1
// while the blob is live. A blob being reclaimed is waited for; a blob with no row is put
// again (blob first) and then recorded (row last).
async function reference(env, ref, bytes) {
  const hash = await sha256(bytes);
  const key = `blobs/${hash}`;
  for (let attempt = 0; ; attempt++) {
    if (attempt === 500) return json({ error: "the blob stayed claimed" }, 503);
    const { meta } = await env.DB.prepare("UPDATE blobs SET refs = refs + 1 WHERE hash = ? AND state = 'live'").bind(hash).run();
    if (meta.changes === 1) break;
    if (await env.DB.prepare("SELECT state FROM blobs WHERE hash = ?").bind(hash).first()) {
      await new Promise((resolve) => setTimeout(resolve, 5));
      continue;
    }
    await env.PHOTOS.put(key, bytes);
    const created = await env.DB.prepare("INSERT INTO blobs (hash, refs, state) VALUES (?, 1, 'live') ON CONFLICT(hash) DO NOTHING")
      .bind(hash)
      .run();
    if (created.meta.changes === 1) break;
  }
  await env.DB.prepare("INSERT INTO blob_refs (ref, hash) VALUES (?, ?)").bind(ref, hash).run();
  return { hash };
}

// Deletes blobs nobody references: claim (state 'deleting', only while refs = 0), delete the
// bytes, then the row.
async function reclaimBlobs(env) {
  const idle = (await env.DB.prepare("SELECT hash FROM blobs WHERE refs = 0 AND state = 'live'").all()).results;
  let deleted = 0;
  for (const { hash } of idle) {
    const { meta } = await env.DB.prepare("UPDATE blobs SET state = 'deleting' WHERE hash = ? AND refs = 0 AND state = 'live'")
      .bind(hash)
      .run();
    if (meta.changes !== 1) continue;
    await env.PHOTOS.delete(`blobs/${hash}`);
    const gone = await env.DB.prepare("DELETE FROM blobs WHERE hash = ? AND state = 'deleting'").bind(hash).run();
    if (gone.meta.changes === 1) deleted++;
  }
  return { deleted };
}

async function release(env, ref) {
  const row = await env.DB.prepare("DELETE FROM blob_refs WHERE ref = ? RETURNING hash").bind(ref).first();
  if (row) await env.DB.prepare("UPDATE blobs SET refs = refs - 1 WHERE hash = ?").bind(row.hash).run();
  return { released: !!row };
}

async function audit(env) {
  const live = (await env.DB.prepare("SELECT hash FROM blobs WHERE refs > 0").all()).results;
  const missing = [];
  for (const { hash } of live) if (!(await env.PHOTOS.head(`blobs/${hash}`))) missing.push(hash);
  return { referenced: live.length, missing };
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const parts = url.pathname.split("/").filter(Boolean);
    if (request.method === "POST" && url.pathname === "/setup") return (await setup(env), json({ ok: true }));
    if (request.method === "POST" && url.pathname === "/uploads") return json(await presign(env, url.searchParams.get("type")));
    if (request.method === "POST" && parts[0] === "uploads" && parts[2] === "done") return finish(env, parts[1]);
    if (request.method === "POST" && url.pathname === "/reclaim") return json(await reclaim(env));
    if (request.method === "POST" && url.pathname === "/seed") {
      return json(await seed(env, Number(url.searchParams.get("count")), Number(url.searchParams.get("referenced"))));
    }
    if (request.method === "POST" && parts[0] === "refs") {
      const made = await reference(env, parts[1], await request.arrayBuffer());
      return made instanceof Response ? made : json(made);
    }
    if (request.method === "DELETE" && parts[0] === "refs") return json(await release(env, parts[1]));
    if (request.method === "POST" && url.pathname === "/reclaim-blobs") return json(await reclaimBlobs(env));
    if (url.pathname === "/audit") return json(await audit(env));
    if (url.pathname === "/photos") return json((await env.DB.prepare("SELECT id, key, status FROM photos ORDER BY id").all()).results);
    return new Response("not found", { status: 404 });
  },
};
