// Kysely against kura through kysely-d1's dialect, given kura-bindings' D1Database where a
// Worker gives `env.DB`: schema building, typed queries and the guarded UPDATE's row count.

import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import { Kysely, sql } from "kysely";
import { D1Dialect } from "kysely-d1";

import { d1 } from "../dist/index.js";
import { connection, createDatabase } from "./support.mjs";

interface Database {
  accounts: { id: number; owner: string; balance: number; version: number };
}

describe("Kysely (kysely-d1)", () => {
  let db: Kysely<Database>;

  before(async () => {
    const database = await createDatabase("node-kysely");
    db = new Kysely<Database>({ dialect: new D1Dialect({ database: d1({ ...connection, database: database.name }) }) });
    await db.schema
      .createTable("accounts")
      .addColumn("id", "integer", (c) => c.primaryKey())
      .addColumn("owner", "text", (c) => c.notNull().unique())
      .addColumn("balance", "integer", (c) => c.notNull())
      .addColumn("version", "integer", (c) => c.notNull().defaultTo(1))
      .execute();
  });

  test("inserts and typed selects", async () => {
    const inserted = await db
      .insertInto("accounts")
      .values([
        { id: 1, owner: "ada", balance: 100, version: 1 },
        { id: 2, owner: "grace", balance: 5, version: 1 },
      ])
      .executeTakeFirst();
    assert.equal(inserted.numInsertedOrUpdatedRows, 2n);
    const rows = await db.selectFrom("accounts").select(["owner", "balance"]).where("balance", ">", 10).execute();
    assert.deepEqual(rows, [{ owner: "ada", balance: 100 }]);
    const total = await db
      .selectFrom("accounts")
      .select(sql<number>`sum(balance)`.as("total"))
      .executeTakeFirstOrThrow();
    assert.equal(total.total, 105);
  });

  test("the version-guarded UPDATE through Kysely: one racer updates one row, the other none", async () => {
    const guarded = (balance: number) =>
      db
        .updateTable("accounts")
        .set((eb) => ({ balance, version: eb("version", "+", 1) }))
        .where("id", "=", 1)
        .where("version", "=", 1)
        .executeTakeFirst();
    const [a, b] = await Promise.all([guarded(90), guarded(80)]);
    assert.deepEqual([a.numUpdatedRows, b.numUpdatedRows].sort(), [0n, 1n]);
    const row = await db.selectFrom("accounts").selectAll().where("id", "=", 1).executeTakeFirstOrThrow();
    assert.equal(row.version, 2);
    assert.equal(row.balance, a.numUpdatedRows === 1n ? 90 : 80);
  });

  test("errors reach the caller as D1's", async () => {
    await assert.rejects(
      db.insertInto("accounts").values({ id: 3, owner: "ada", balance: 1, version: 1 }).execute(),
      /^Error: D1_ERROR: UNIQUE constraint failed: accounts\.owner: SQLITE_CONSTRAINT/,
    );
  });
});
