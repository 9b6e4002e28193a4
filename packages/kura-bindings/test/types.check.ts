// Compiled, never run (`npm run check`): kura-bindings' objects are assignable to Cloudflare's
// own types from @cloudflare/workers-types, so code typed for `env.DB` (kysely-d1's dialect,
// Drizzle's driver) takes them. A method missing or of another shape fails the build.
//
// R2Bucket itself cannot be checked this way: workers-types declares workerd's own Blob, Headers
// and ReadableStream, which Node's are not assignable to (their `bytes()` differ in generics),
// so its methods' parameters never match. The objects R2Bucket returns are checked instead.

import type {
  D1Database as CloudflareD1Database,
  D1DatabaseSession as CloudflareD1DatabaseSession,
  D1PreparedStatement as CloudflareD1PreparedStatement,
  R2Object as CloudflareR2Object,
  R2Objects as CloudflareR2Objects,
  R2UploadedPart as CloudflareR2UploadedPart,
} from "@cloudflare/workers-types/latest/index.ts";

import { d1, r2, type R2Object } from "../dist/index.js";

const DB = d1({ database: "typed" });
export const database: CloudflareD1Database = DB;
export const session: CloudflareD1DatabaseSession = DB.withSession("first-primary");
export const statement: CloudflareD1PreparedStatement = DB.prepare("SELECT 1").bind(1);

const BUCKET = r2({ bucket: "typed" });
export async function objects(): Promise<[CloudflareR2Object | null, CloudflareR2Objects, CloudflareR2UploadedPart]> {
  const found: R2Object | null = await BUCKET.head("key");
  const listed = await BUCKET.list({ include: ["customMetadata"] });
  const part = await BUCKET.resumeMultipartUpload("key", "id").uploadPart(1, "part");
  return [found, listed, part];
}
