// Runs SQL cases through a D1 binding in Miniflare (real workerd and Miniflare's D1) and
// prints, per case, its rows (as arrays), rows_read, rows_written and changes, or its error
// message without the binding's `D1_ERROR: ` prefix: the oracle for fidelity.rs.
// Usage: node d1_sql.mjs <miniflare module> <cases.json>
import { readFileSync } from "node:fs";

const [miniflarePath, casesPath] = process.argv.slice(2);
const { Miniflare } = await import(miniflarePath);
const script = `
export default {
  async fetch(request, env) {
    const out = [];
    for (const c of await request.json()) {
      try {
        const result = await env.DB.prepare(c.sql).bind(...(c.params || [])).all();
        const rows = result.results.map((row) => Object.values(row));
        const { rows_read, rows_written, changes } = result.meta;
        out.push({ rows, rows_read, rows_written, changes });
      } catch (e) {
        out.push({ error: e.message.replace(/^D1_ERROR: /, "") });
      }
    }
    return Response.json(out);
  },
};
`;
const mf = new Miniflare({ modules: true, script, compatibilityDate: "2025-01-01", d1Databases: ["DB"] });
try {
  const response = await mf.dispatchFetch("http://probe/", { method: "POST", body: readFileSync(casesPath) });
  process.stdout.write(JSON.stringify(await response.json()));
} finally {
  await mf.dispose();
}
