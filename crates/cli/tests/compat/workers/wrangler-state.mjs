// Makes a `wrangler dev` project's local state the way wrangler dev makes it: Miniflare (the
// one wrangler 4.85.0 bundles) running the rooms Worker with `.wrangler/state/v3`'s layout
// (d1/, r2/, kv/, do/ with the Worker's name in the unique key, the local explorer's object
// names).
//   node wrangler-state.mjs <state dir> <rooms/src/index.js>
import { Miniflare } from "miniflare";
import { readFileSync } from "node:fs";

const [root, scriptPath] = process.argv.slice(2);
const mf = new Miniflare({
  name: "rooms",
  modules: true,
  compatibilityDate: "2025-06-01",
  script: readFileSync(scriptPath, "utf8"),
  // wrangler dev's local id for a binding without database_id is the binding's name.
  d1Databases: { DB: "DB" },
  r2Buckets: { AVATARS: "avatars" },
  // wrangler dev's local id for a KV binding is its `id`.
  kvNamespaces: { CACHE: "c0ffee00c0ffee00c0ffee00c0ffee00" },
  durableObjects: { ROOMS: { className: "Room", useSQLite: true } },
  d1Persist: root + "/d1",
  r2Persist: root + "/r2",
  kvPersist: root + "/kv",
  durableObjectsPersist: root + "/do",
  unsafeLocalExplorer: true,
});
for (const path of ["/setup", "/rooms/red/join?name=alice", "/rooms/blue/join?name=bob"]) {
  const response = await mf.dispatchFetch("http://rooms" + path, { method: "POST" });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
}
const avatars = await mf.getR2Bucket("AVATARS");
await avatars.put("alice.png", new Uint8Array([137, 80, 78, 71]), { httpMetadata: { contentType: "image/png" }, customMetadata: { owner: "alice" } });
const cache = await mf.getKVNamespace("CACHE");
await cache.put("greeting", "hello", { metadata: { lang: "en" }, expirationTtl: 86400 });
await cache.put("large", "x".repeat(100000));
await mf.dispose();
console.log("state written");
