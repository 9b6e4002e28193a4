// What the suites share: the server under test (from the environment the Rust harness sets)
// and v4 API calls to make the databases and buckets they use.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";

export const url = required("KURA_URL");
export const token = required("KURA_API_TOKEN");
export const account = required("KURA_ACCOUNT_ID");
export const connection = { url, token };
/** A token that may only read D1 (made by the harness with `kura tokens create`). */
export const d1ReadToken = required("KURA_D1_READ_TOKEN");
/** A token that reaches only the R2 bucket `limitedBucket`. */
export const bucketToken = required("KURA_R2_BUCKET_TOKEN");
export const limitedBucket = required("KURA_R2_TOKEN_BUCKET");

function required(name) {
  const value = process.env[name];
  assert.ok(value, `${name} must be set (the Rust harness in crates/cli/tests/compat/node_bindings.rs sets it)`);
  return value;
}

/** A name no other run uses. */
export function unique(prefix) {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** A v4 API call that must succeed; its `result`. */
export async function v4(method, path, body) {
  const response = await fetch(`${url}/client/v4/accounts/${account}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const envelope = await response.json();
  assert.ok(envelope.success, `${method} ${path}: ${JSON.stringify(envelope.errors)}`);
  return envelope.result;
}

/** A new D1 database: its uuid and name. */
export async function createDatabase(prefix) {
  const name = unique(prefix);
  const created = await v4("POST", "/d1/database", { name });
  return { uuid: created.uuid, name };
}

/** A new R2 bucket's name. */
export async function createBucket(prefix) {
  const name = unique(prefix);
  await v4("POST", "/r2/buckets", { name });
  return name;
}

/** The error a promise rejects with (and fails if it resolves). */
export async function rejection(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail("expected the call to fail");
}
