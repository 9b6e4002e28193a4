// A Worker whose env.DB is workerd's own D1 binding (cloudflare-internal:d1-api) pointed at
// kura. Each path runs one scenario and answers what the binding returned, as JSON.
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const db = env.DB;
    const out = {};
    try {
      switch (url.pathname) {
        case "/scenario": {
          out.exec = await db.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, b BLOB)\nCREATE INDEX t_v ON t(v)");
          out.run = await db.prepare("INSERT INTO t (v, b) VALUES (?, ?)").bind("one", new Uint8Array([1, 2, 3])).run();
          out.all = await db.prepare("SELECT * FROM t").all();
          out.first = await db.prepare("SELECT v FROM t WHERE id = ?").bind(1).first("v");
          out.raw = await db.prepare("SELECT id, v FROM t").raw({ columnNames: true });
          out.batch = await db.batch([
            db.prepare("INSERT INTO t (v) VALUES (?)").bind("two"),
            db.prepare("SELECT count(*) AS n FROM t"),
          ]);
          try {
            await db.batch([db.prepare("INSERT INTO t (v) VALUES ('lost')"), db.prepare("INSERT INTO nope VALUES (1)")]);
          } catch (e) {
            out.batchError = e.message;
          }
          out.afterFailedBatch = await db.prepare("SELECT count(*) AS n FROM t").first("n");
          try {
            await db.prepare("SELECT * FROM nope").all();
          } catch (e) {
            out.error = e.message;
          }
          const session = db.withSession("first-primary");
          await session.prepare("INSERT INTO t (v) VALUES ('three')").run();
          out.bookmark = session.getBookmark();
          const later = db.withSession(out.bookmark);
          out.sessionRead = await later.prepare("SELECT count(*) AS n FROM t").first("n");
          out.laterBookmark = later.getBookmark();
          return Response.json(out);
        }
        case "/insert": {
          const r = await db.prepare("INSERT INTO t (v) VALUES (?)").bind(url.searchParams.get("v")).run();
          return Response.json(r.meta);
        }
        case "/count":
          return Response.json(await db.prepare("SELECT count(*) AS n FROM t").first("n"));
        default:
          return new Response("no such scenario", { status: 404 });
      }
    } catch (e) {
      return new Response(`scenario failed: ${e.message}`, { status: 500 });
    }
  },
};
