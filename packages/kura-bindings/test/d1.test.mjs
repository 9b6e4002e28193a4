// D1Database against a real kura: each method's result shape, bind's conversions, the error
// texts a Worker sees, batches' atomicity, exec, sessions and the version-guarded UPDATE race.

import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import { d1 } from "../dist/index.js";
import { connection, createDatabase, d1ReadToken, rejection, token, url } from "./support.mjs";

const META_FIELDS = ["duration", "size_after", "rows_read", "rows_written", "last_row_id", "changed_db", "changes"];

describe("D1Database", () => {
  let DB;
  let database;

  before(async () => {
    database = await createDatabase("node-d1");
    DB = d1({ ...connection, database: database.name });
    await DB.exec(
      [
        "CREATE TABLE colours (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, rgb BLOB)",
        "INSERT INTO colours (id, name) VALUES (1, 'red'), (2, 'green'), (3, 'blue')",
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)",
        "INSERT INTO accounts VALUES (1, 100, 1)",
      ].join("\n"),
    );
  });

  test("all() answers objects and D1's meta", async () => {
    const result = await DB.prepare("SELECT id, name FROM colours WHERE id <= ? ORDER BY id").bind(2).all();
    assert.equal(result.success, true);
    assert.deepEqual(result.results, [
      { id: 1, name: "red" },
      { id: 2, name: "green" },
    ]);
    for (const field of META_FIELDS) assert.ok(field in result.meta, `meta.${field}`);
    assert.equal(result.meta.changes, 0);
    assert.equal(result.meta.changed_db, false);
    assert.ok(result.meta.rows_read >= 2);
  });

  test("the database is found by its id as well as its name", async () => {
    const byId = d1({ ...connection, database: database.uuid });
    assert.equal(await byId.prepare("SELECT count(*) AS n FROM colours").first("n"), 3);
  });

  test("first() gives the first row, a column of it, or null", async () => {
    assert.deepEqual(await DB.prepare("SELECT name FROM colours ORDER BY id").first(), { name: "red" });
    assert.equal(await DB.prepare("SELECT name FROM colours WHERE id = ?").bind(3).first("name"), "blue");
    assert.equal(await DB.prepare("SELECT name FROM colours WHERE id = 99").first("name"), null);
    assert.equal(await DB.prepare("SELECT NULL AS absent").first("absent"), null);
    const missing = await rejection(DB.prepare("SELECT name FROM colours").first("hue"));
    assert.equal(missing.message, "D1_COLUMN_NOTFOUND: Column not found (hue)");
  });

  test("raw() gives arrays, with the columns first when asked, duplicates kept", async () => {
    const sql = "SELECT 1 AS a, 2 AS b, 3 AS b";
    assert.deepEqual(await DB.prepare(sql).raw(), [[1, 2, 3]]);
    assert.deepEqual(await DB.prepare(sql).raw({ columnNames: true }), [["a", "b", "b"], [1, 2, 3]]);
    // As objects, the last column of a name wins.
    assert.deepEqual((await DB.prepare(sql).all()).results, [{ a: 1, b: 3 }]);
    assert.deepEqual(await DB.prepare("SELECT 1 AS a WHERE 0").raw({ columnNames: true }), [["a"]]);
  });

  test("run() reports changes and last_row_id; RETURNING rows come back", async () => {
    const inserted = await DB.prepare("INSERT INTO colours (name) VALUES (?)").bind("cyan").run();
    assert.equal(inserted.meta.changes, 1);
    assert.equal(inserted.meta.changed_db, true);
    assert.ok(inserted.meta.last_row_id > 3);
    assert.deepEqual(inserted.results, []);
    const returned = await DB.prepare("UPDATE colours SET name = ? WHERE name = ? RETURNING id").bind("teal", "cyan").run();
    assert.deepEqual(returned.results, [{ id: inserted.meta.last_row_id }]);
  });

  test("bind() converts as a Worker's binding does, and refuses what D1 cannot store", async () => {
    const statement = DB.prepare("SELECT ? AS b, ? AS n, ? AS s, ? AS blob, ? AS view");
    const bound = statement.bind(true, null, "x", new Uint8Array([1, 2, 255]).buffer, new Uint8Array([7, 8]));
    assert.deepEqual(statement.params, [], "bind() leaves the statement it was called on alone");
    assert.deepEqual(await bound.first(), { b: 1, n: null, s: "x", blob: [1, 2, 255], view: [7, 8] });
    const rgb = [0, 128, 255];
    await DB.prepare("UPDATE colours SET rgb = ? WHERE id = 3").bind(rgb).run();
    assert.deepEqual(await DB.prepare("SELECT rgb FROM colours WHERE id = 3").first("rgb"), rgb);
    assert.throws(() => statement.bind(undefined), {
      message: "D1_TYPE_ERROR: Type 'undefined' not supported for value 'undefined'",
    });
    assert.throws(() => statement.bind(1n), { message: "D1_TYPE_ERROR: Type 'bigint' not supported for value '1'" });
    assert.throws(() => statement.bind({}), /^Error: D1_TYPE_ERROR: Type 'object'/);
  });

  test("SQL errors are D1's texts", async () => {
    const noTable = await rejection(DB.prepare("SELECT * FROM nope").all());
    assert.equal(noTable.message, "D1_ERROR: no such table: nope: SQLITE_ERROR");
    assert.equal(noTable.cause.message, "no such table: nope: SQLITE_ERROR");
    const unique = await rejection(DB.prepare("INSERT INTO colours (name) VALUES ('red')").run());
    assert.match(unique.message, /^D1_ERROR: UNIQUE constraint failed: colours\.name: SQLITE_CONSTRAINT/);
  });

  test("a batch is one transaction: a failing statement undoes the others", async () => {
    const results = await DB.batch([
      DB.prepare("INSERT INTO colours (name) VALUES (?)").bind("black"),
      DB.prepare("SELECT count(*) AS n FROM colours WHERE name = 'black'"),
    ]);
    assert.equal(results.length, 2);
    assert.equal(results[0].meta.changes, 1);
    assert.deepEqual(results[1].results, [{ n: 1 }]);
    const failed = await rejection(
      DB.batch([DB.prepare("INSERT INTO colours (name) VALUES ('white')"), DB.prepare("INSERT INTO nope VALUES (1)")]),
    );
    assert.equal(failed.message, "D1_ERROR: no such table: nope: SQLITE_ERROR");
    assert.equal(await DB.prepare("SELECT count(*) AS n FROM colours WHERE name = 'white'").first("n"), 0);
    const empty = await rejection(DB.batch([]));
    assert.equal(empty.message, "D1_ERROR: No SQL statements detected.");
  });

  test("exec() runs one statement per line and reports the failing line as D1 does", async () => {
    const done = await DB.exec("CREATE TABLE notes (body TEXT)\nINSERT INTO notes VALUES ('a')\nINSERT INTO notes VALUES ('b')");
    assert.equal(done.count, 3);
    assert.equal(typeof done.duration, "number");
    const failed = await rejection(DB.exec("INSERTZ INTO notes VALUES ('c')"));
    assert.match(failed.message, /^D1_EXEC_ERROR: Error in line 1: INSERTZ INTO notes VALUES \('c'\): near "INSERTZ": syntax error/);
    assert.equal(await DB.prepare("SELECT count(*) AS n FROM notes").first("n"), 2);
  });

  test("the version-guarded UPDATE: of two racing writers one changes the row, the other sees changes: 0", async () => {
    const guarded = (balance) =>
      DB.prepare("UPDATE accounts SET balance = ?, version = version + 1 WHERE id = 1 AND version = ?").bind(balance, 1);
    const [a, b] = await Promise.all([guarded(90).run(), guarded(80).run()]);
    assert.deepEqual([a.success, b.success], [true, true]);
    assert.deepEqual([a.meta.changes, b.meta.changes].sort(), [0, 1]);
    const row = await DB.prepare("SELECT balance, version FROM accounts WHERE id = 1").first();
    assert.equal(row.version, 2);
    assert.equal(row.balance, a.meta.changes === 1 ? 90 : 80);
  });

  test("sessions carry bookmarks: null before the first query, then never going back", async () => {
    const session = DB.withSession("first-primary");
    assert.equal(session.getBookmark(), null);
    await session.prepare("INSERT INTO notes VALUES ('session')").run();
    const first = session.getBookmark();
    assert.match(first, /^[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{32}$/);
    await session.batch([session.prepare("SELECT count(*) FROM notes")]);
    assert.ok(session.getBookmark().localeCompare(first) >= 0);
    // A later session may start at that bookmark; one that is not a bookmark is refused.
    const resumed = DB.withSession(first);
    assert.equal(resumed.getBookmark(), first);
    assert.equal(await resumed.prepare("SELECT body FROM notes WHERE body = 'session'").first("body"), "session");
    const bad = await rejection(DB.withSession("not-a-bookmark").prepare("SELECT 1").all());
    assert.match(bad.message, /^D1_ERROR: /);
  });

  test("a database that does not exist, and a token that is not one, fail as D1_ERROR", async () => {
    const missing = await rejection(d1({ ...connection, database: "no-such-database" }).prepare("SELECT 1").all());
    assert.match(missing.message, /^D1_ERROR: .*no-such-database/);
    const stranger = await rejection(d1({ url, token: "not-a-token", database: database.name }).prepare("SELECT 1").all());
    assert.equal(stranger.message, "D1_ERROR: Authentication error");
    assert.throws(() => d1({ url, token }), TypeError);
  });

  test("a read-only token reads and cannot write", async () => {
    const reader = d1({ url, token: d1ReadToken, database: database.name });
    assert.equal(await reader.prepare("SELECT count(*) AS n FROM accounts").first("n"), 1);
    const write = await rejection(reader.prepare("DELETE FROM accounts").run());
    assert.match(write.message, /^D1_ERROR: /);
    assert.equal(await DB.prepare("SELECT count(*) AS n FROM accounts").first("n"), 1);
  });
});
