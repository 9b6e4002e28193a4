// kura-bindings: Cloudflare's `D1Database` and `R2Bucket` for Node.js, against a kura server.
//
//   import { d1, r2 } from "kura-bindings";
//   const DB = d1({ url: "http://127.0.0.1:8780", token, database: "app" });
//   const BUCKET = r2({ url: "http://127.0.0.1:8780", token, bucket: "uploads" });
//
// Both speak the binding protocols a Worker's `env.DB` and `env.BUCKET` speak (kura serves them
// at `/binding/d1/{database}` and `/binding/r2/{bucket}` on its API listener), so results, meta
// fields and error texts are a Worker's, and ORMs made for D1 (Drizzle's `drizzle-orm/d1`,
// `kysely-d1`) take `DB` as they take `env.DB`.

export type { KuraConnection } from "./connection.js";
export {
  d1,
  D1Database,
  D1DatabaseSession,
  D1PreparedStatement,
  type D1Options,
  type D1Meta,
  type D1Response,
  type D1Result,
  type D1ExecResult,
  type D1SessionBookmark,
  type D1SessionConstraint,
} from "./d1.js";
export {
  r2,
  R2Bucket,
  R2MultipartUpload,
  R2Object,
  R2ObjectBody,
  type R2Options,
  type R2Checksums,
  type R2Conditional,
  type R2GetOptions,
  type R2HTTPMetadata,
  type R2ListOptions,
  type R2MultipartOptions,
  type R2Objects,
  type R2PutOptions,
  type R2PutValue,
  type R2Range,
  type R2StringChecksums,
  type R2UploadedPart,
  type R2UploadPartOptions,
} from "./r2.js";
