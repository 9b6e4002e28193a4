// kura-bench's Node side: point SELECTs through kura-bindings' D1Database, CONCURRENCY promise
// loops for SECONDS, as `DB.prepare(...).bind(id).first()` in an application. Prints one JSON
// line: queries done, seconds, and the median and 99th-percentile latency. With MODE=raw the
// same requests go through undici by hand (what the client sends, without the client): the
// floor a Node client of kura's binding protocol stands on.
//
//   KURA_URL=… KURA_API_TOKEN=… DATABASE=… SECONDS=5 CONCURRENCY=16 [MODE=raw] node bench/point-select.mjs

import { Agent, request } from "undici";

import { d1 } from "../dist/index.js";

const seconds = Number(process.env.SECONDS ?? 5);
const concurrency = Number(process.env.CONCURRENCY ?? 16);
const rows = Number(process.env.ROWS ?? 10000);
const DB = d1({ database: process.env.DATABASE });
const statement = DB.prepare("SELECT * FROM kv WHERE id = ?");

const dispatcher = new Agent({ keepAliveTimeout: 30_000 });
const url = `${process.env.KURA_URL}/binding/d1/${encodeURIComponent(process.env.DATABASE)}/query?resultsFormat=ROWS_AND_COLUMNS`;
const headers = { authorization: `Bearer ${process.env.KURA_API_TOKEN}`, "content-type": "application/json" };
async function rawFirst(id) {
  const body = JSON.stringify({ sql: "SELECT * FROM kv WHERE id = ?", params: [id] });
  const answer = await request(url, { method: "POST", headers, body, dispatcher });
  const [result] = JSON.parse(await answer.body.text());
  return result.results.rows[0] ?? null;
}
const first = process.env.MODE === "raw" ? rawFirst : (id) => statement.bind(id).first();

// Warm the connections first, as kura-bench's client is warm.
await Promise.all(Array.from({ length: concurrency }, (_, c) => first(c)));

const latencies = [];
const started = performance.now();
const deadline = started + seconds * 1000;
async function client(c) {
  let n = 0;
  while (performance.now() < deadline) {
    const id = Math.abs((c * 104729 + n * 7919) % rows);
    const began = performance.now();
    const row = await first(id);
    latencies.push(performance.now() - began);
    if (row === null) throw new Error(`row ${id} is missing`);
    n++;
  }
}
await Promise.all(Array.from({ length: concurrency }, (_, c) => client(c)));
const elapsed = (performance.now() - started) / 1000;
latencies.sort((a, b) => a - b);
const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * q))] ?? 0;
console.log(JSON.stringify({ queries: latencies.length, seconds: elapsed, p50_ms: at(0.5), p99_ms: at(0.99) }));
await dispatcher.close();
