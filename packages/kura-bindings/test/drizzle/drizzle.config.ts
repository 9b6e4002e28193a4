// drizzle-kit's configuration for the Drizzle suite: SQLite migrations generated into
// DRIZZLE_OUT (a scratch folder of the test), for wrangler to apply.

import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "sqlite",
  schema: "./test/drizzle/schema.ts",
  out: process.env.DRIZZLE_OUT ?? "./test/drizzle/migrations",
});
