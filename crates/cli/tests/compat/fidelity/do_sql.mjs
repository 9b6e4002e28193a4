// Runs SQL cases on a SQLite-backed Durable Object in Miniflare (real workerd) and prints, per
// case, its rows, rowsRead and rowsWritten, or its error message: the oracle for fidelity.rs.
// Usage: node do_sql.mjs <miniflare module> <cases.json>
import { readFileSync } from "node:fs";

const [miniflarePath, casesPath] = process.argv.slice(2);
const { Miniflare } = await import(miniflarePath);
const script = `
export class Probe {
  constructor(state) { this.state = state; }
  async fetch(request) {
    const out = [];
    for (const c of await request.json()) {
      try {
        const cursor = this.state.storage.sql.exec(c.sql, ...(c.params || []));
        // Blobs as arrays of bytes, as kura's JSON carries them.
        const rows = cursor.raw().toArray().map((row) =>
          row.map((v) => (v instanceof ArrayBuffer ? Array.from(new Uint8Array(v)) : v)));
        out.push({ rows, rows_read: cursor.rowsRead, rows_written: cursor.rowsWritten });
      } catch (e) {
        out.push({ error: e.message });
      }
    }
    return Response.json(out);
  }
}
export default {
  fetch(request, env) { return env.PROBE.get(env.PROBE.idFromName("probe")).fetch(request); },
};
`;
const mf = new Miniflare({
  modules: true,
  script,
  compatibilityDate: "2025-01-01",
  durableObjects: { PROBE: { className: "Probe", useSQLite: true } },
});
try {
  const response = await mf.dispatchFetch("http://probe/", { method: "POST", body: readFileSync(casesPath) });
  process.stdout.write(JSON.stringify(await response.json()));
} finally {
  await mf.dispose();
}
