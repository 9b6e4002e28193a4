// The Workers peer: Miniflare (what `wrangler dev` runs) serving the benchmark's Worker over
// HTTP, with a D1 database, an R2 bucket, a KV namespace, a queue it consumes and a SQLite-backed Durable Object class, persisted
// under the directory given, and a directory of static assets. Prints {"url": …} once ready, and runs until stdin closes.
import { Miniflare } from "miniflare";
import { readFileSync } from "node:fs";

const [dir, scriptPath, assetsDir] = process.argv.slice(2);
const mf = new Miniflare({
  modules: true,
  compatibilityDate: "2025-04-01",
  script: readFileSync(scriptPath, "utf8"),
  d1Databases: ["DB"],
  r2Buckets: ["FILES"],
  kvNamespaces: ["CACHE"],
  queueProducers: { Q: { queueName: "bench-q" } },
  queueConsumers: { "bench-q": { maxBatchSize: 100, maxBatchTimeout: 1 } },
  durableObjects: { ROOMS: { className: "Room", useSQLite: true } },
  d1Persist: dir + "/d1",
  r2Persist: dir + "/r2",
  kvPersist: dir + "/kv",
  durableObjectsPersist: dir + "/do",
  // Static assets, as `wrangler dev` serves an [assets] directory.
  // (wrangler dev sets has_user_worker when the project has a `main`, as this one does).
  assets: { directory: assetsDir, routerConfig: { has_user_worker: true } },
  port: 0,
});
const url = await mf.ready;
console.log(JSON.stringify({ url: url.toString(), pid: process.pid }));
process.stdin.resume();
process.stdin.on("end", async () => {
  await mf.dispose();
  process.exit(0);
});
