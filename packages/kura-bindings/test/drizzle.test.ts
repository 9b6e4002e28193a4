// Drizzle against kura, as a D1 project uses it: drizzle-kit generates the migrations, real
// wrangler applies them with `d1 migrations apply --remote`, and `drizzle-orm/d1` runs its
// queries through kura-bindings' D1Database, change counts included.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { and, eq, sql } from "drizzle-orm";
import { drizzle, type DrizzleD1Database } from "drizzle-orm/d1";

import { d1 } from "../dist/index.js";
import { connection, createDatabase } from "./support.mjs";
import * as schema from "./drizzle/schema.js";

const wrangler = process.env.WRANGLER;

describe("Drizzle (drizzle-orm/d1, drizzle-kit, wrangler migrations)", () => {
  let db: DrizzleD1Database<typeof schema>;
  let project = "";

  after(() => {
    if (project) rmSync(project, { recursive: true, force: true });
  });

  before(async () => {
    assert.ok(wrangler, "WRANGLER must name the wrangler the harness installed");
    const database = await createDatabase("node-drizzle");
    project = mkdtempSync(join(tmpdir(), "kura-drizzle-"));
    const migrations = join(project, "migrations");
    execFileSync("node_modules/.bin/drizzle-kit", ["generate", "--config", "test/drizzle/drizzle.config.ts"], {
      env: { ...process.env, DRIZZLE_OUT: migrations },
      stdio: "pipe",
    });
    const generated = readdirSync(migrations).filter((f) => f.endsWith(".sql"));
    assert.equal(generated.length, 1, `drizzle-kit generated ${generated.join(", ")}`);
    writeFileSync(
      join(project, "wrangler.toml"),
      [
        'name = "drizzle-on-kura"',
        "[[d1_databases]]",
        'binding = "DB"',
        `database_name = "${database.name}"`,
        `database_id = "${database.uuid}"`,
        'migrations_dir = "migrations"',
      ].join("\n"),
    );
    const applied = execFileSync(wrangler, ["d1", "migrations", "apply", database.name, "--remote"], {
      cwd: project,
      env: process.env,
      encoding: "utf8",
      stdio: "pipe",
    });
    assert.match(applied, new RegExp(generated[0]!.replace(".", "\\.")));
    db = drizzle(d1({ ...connection, database: database.name }), { schema });
  });

  test("inserts return rows; selects, joins and relational queries read them", async () => {
    const [ada] = await db.insert(schema.users).values({ email: "ada@example.com", name: "Ada" }).returning();
    assert.ok(ada);
    assert.equal(ada.name, "Ada");
    assert.ok(ada.createdAt instanceof Date);
    await db.insert(schema.accounts).values([
      { id: 1, userId: ada.id, balance: 100 },
      { id: 2, userId: ada.id, balance: 5 },
    ]);
    const rich = await db.select().from(schema.accounts).where(sql`${schema.accounts.balance} > 10`);
    assert.deepEqual(
      rich.map((a) => a.id),
      [1],
    );
    const joined = await db
      .select({ email: schema.users.email, balance: schema.accounts.balance })
      .from(schema.accounts)
      .innerJoin(schema.users, eq(schema.users.id, schema.accounts.userId))
      .where(eq(schema.accounts.id, 2));
    assert.deepEqual(joined, [{ email: "ada@example.com", balance: 5 }]);
    const withAccounts = await db.query.users.findFirst({
      where: eq(schema.users.email, "ada@example.com"),
      with: { accounts: { orderBy: (a, { asc }) => asc(a.id) } },
    });
    assert.deepEqual(
      withAccounts?.accounts.map((a) => a.balance),
      [100, 5],
    );
  });

  test("the version-guarded UPDATE through Drizzle: one racer changes the row, the other gets changes: 0", async () => {
    const guarded = (balance: number) =>
      db
        .update(schema.accounts)
        .set({ balance, version: sql`${schema.accounts.version} + 1` })
        .where(and(eq(schema.accounts.id, 1), eq(schema.accounts.version, 1)))
        .run();
    const [a, b] = await Promise.all([guarded(90), guarded(80)]);
    assert.deepEqual([a.success, b.success], [true, true]);
    assert.deepEqual([a.meta.changes, b.meta.changes].sort(), [0, 1]);
    const [row] = await db.select().from(schema.accounts).where(eq(schema.accounts.id, 1));
    assert.equal(row?.version, 2);
    assert.equal(row?.balance, a.meta.changes === 1 ? 90 : 80);
  });

  test("db.batch is one transaction: a failing statement undoes the batch", async () => {
    const [inserted, counted] = await db.batch([
      db.insert(schema.users).values({ email: "grace@example.com", name: "Grace" }).returning({ id: schema.users.id }),
      db.select({ n: sql<number>`count(*)` }).from(schema.users),
    ]);
    assert.equal(inserted.length, 1);
    assert.equal(counted[0]?.n, 2);
    await assert.rejects(
      db.batch([
        db.insert(schema.users).values({ email: "linus@example.com", name: "Linus" }),
        db.insert(schema.users).values({ email: "ada@example.com", name: "Ada again" }),
      ]),
      /UNIQUE constraint failed: users\.email/,
    );
    const linus = await db.select().from(schema.users).where(eq(schema.users.email, "linus@example.com"));
    assert.deepEqual(linus, []);
  });
});
