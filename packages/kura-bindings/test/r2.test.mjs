// R2Bucket against a real kura: objects' metadata and checksums, ranges, conditionals,
// listing, multipart, streaming a large object both ways, and the errors a Worker sees.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { before, describe, test } from "node:test";

import { R2Object, R2ObjectBody, r2 } from "../dist/index.js";
import { bucketToken, connection, createBucket, limitedBucket, rejection, url, v4 } from "./support.mjs";

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");
const md5 = (bytes) => createHash("md5").update(bytes).digest("hex");

describe("R2Bucket", () => {
  let BUCKET;

  before(async () => {
    BUCKET = r2({ ...connection, bucket: await createBucket("node-r2") });
  });

  test("put returns the object; get and head read it back with its metadata", async () => {
    const key = "docs/héllo wörld.txt";
    const put = await BUCKET.put(key, "hello world", {
      httpMetadata: { contentType: "text/plain", cacheControl: "max-age=60", cacheExpiry: new Date(1_700_000_000_000) },
      customMetadata: { owner: "ünïcode", empty: "" },
    });
    assert.ok(put instanceof R2Object);
    assert.equal(put.key, key);
    assert.equal(put.size, 11);
    assert.equal(put.etag, md5("hello world"));
    assert.equal(put.httpEtag, `"${md5("hello world")}"`);
    assert.match(put.version, /^[0-9a-f]{32}$/);
    assert.equal(put.checksums.toJSON().md5, md5("hello world"));
    assert.equal(put.storageClass, "Standard");

    const got = await BUCKET.get(key);
    assert.ok(got instanceof R2ObjectBody);
    assert.equal(await got.text(), "hello world");
    assert.equal(got.bodyUsed, true);
    assert.equal(got.version, put.version);
    assert.deepEqual(got.customMetadata, { owner: "ünïcode", empty: "" });
    assert.equal(got.httpMetadata.contentType, "text/plain");
    assert.equal(got.httpMetadata.cacheExpiry.getTime(), 1_700_000_000_000);
    assert.equal(got.uploaded.getTime(), put.uploaded.getTime());
    const headers = new Headers();
    got.writeHttpMetadata(headers);
    assert.equal(headers.get("content-type"), "text/plain");
    assert.equal(headers.get("cache-control"), "max-age=60");

    const head = await BUCKET.head(key);
    assert.equal(head.size, 11);
    assert.deepEqual(head.range, { offset: 0, length: 11 });
    assert.equal(await BUCKET.head("missing"), null);
    assert.equal(await BUCKET.get("missing"), null);
  });

  test("values of every kind are stored byte for byte", async () => {
    const bytes = randomBytes(1000);
    const values = {
      string: "text ✓",
      buffer: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length),
      view: new Uint8Array(bytes),
      blob: new Blob([bytes]),
      stream: new Blob([bytes]).stream(),
      empty: null,
    };
    for (const [name, value] of Object.entries(values)) {
      const put = await BUCKET.put(`kinds/${name}`, value);
      const got = new Uint8Array(await (await BUCKET.get(`kinds/${name}`)).arrayBuffer());
      const expected = name === "string" ? new TextEncoder().encode("text ✓") : name === "empty" ? new Uint8Array() : bytes;
      assert.deepEqual(got, new Uint8Array(expected), name);
      assert.equal(put.size, expected.length, name);
    }
  });

  test("a 20 MiB object streams up and down intact", async () => {
    const bytes = randomBytes(20 * 1024 * 1024);
    const put = await BUCKET.put("large/20mib.bin", new Blob([bytes]).stream(), { sha256: sha256(bytes) });
    assert.equal(put.size, bytes.length);
    assert.equal(put.checksums.toJSON().sha256, sha256(bytes));
    const got = await BUCKET.get("large/20mib.bin");
    const hash = createHash("sha256");
    let length = 0;
    for await (const chunk of got.body) {
      hash.update(chunk);
      length += chunk.length;
    }
    assert.equal(length, bytes.length);
    assert.equal(hash.digest("hex"), sha256(bytes));
  });

  test("ranges: offset, length, suffix, a Range header, and the errors", async () => {
    await BUCKET.put("ranges", "0123456789");
    const read = async (range) => {
      const got = await BUCKET.get("ranges", { range });
      return [await got.text(), got.range];
    };
    assert.deepEqual(await read({ offset: 3 }), ["3456789", { offset: 3, length: 7 }]);
    assert.deepEqual(await read({ offset: 2, length: 3 }), ["234", { offset: 2, length: 3 }]);
    assert.deepEqual(await read({ suffix: 4 }), ["6789", { offset: 6, length: 4 }]);
    assert.deepEqual(await read({ length: 42 }), ["0123456789", { offset: 0, length: 10 }]);
    assert.deepEqual(await read(new Headers({ range: "bytes=1-2" })), ["12", { offset: 1, length: 2 }]);
    const unsatisfiable = await rejection(BUCKET.get("ranges", { range: { offset: 42 } }));
    assert.equal(unsatisfiable.message, "get: The requested range is not satisfiable (10039)");
    await assert.rejects(BUCKET.get("ranges", { range: { offset: -1 } }), RangeError);
    await assert.rejects(BUCKET.get("ranges", { range: { offset: 1.5 } }), TypeError);
    await assert.rejects(BUCKET.get("ranges", { range: { suffix: 1, offset: 1 } }), {
      message: "Suffix is incompatible with offset.",
    });
  });

  test("conditionals: a failed get gives the object without a body, a failed put gives null", async () => {
    const put = await BUCKET.put("conditional", "v1");
    const notModified = await BUCKET.get("conditional", { onlyIf: { etagDoesNotMatch: put.etag } });
    assert.ok(notModified instanceof R2Object && !(notModified instanceof R2ObjectBody));
    assert.equal(notModified.etag, put.etag);
    const matched = await BUCKET.get("conditional", { onlyIf: new Headers({ "if-match": put.httpEtag }) });
    assert.equal(await matched.text(), "v1");
    assert.equal(await BUCKET.put("conditional", "v2", { onlyIf: { etagMatches: "0".repeat(32) } }), null);
    assert.equal(await (await BUCKET.get("conditional")).text(), "v1");
    const replaced = await BUCKET.put("conditional", "v2", { onlyIf: { etagMatches: put.etag } });
    assert.equal(replaced.etag, md5("v2"));
    assert.equal(await BUCKET.put("never-there", "x", { onlyIf: { etagMatches: put.etag } }), null);
    const created = await BUCKET.put("create-only", "x", { onlyIf: new Headers({ "if-none-match": "*" }) });
    assert.ok(created);
    assert.equal(await BUCKET.put("create-only", "y", { onlyIf: new Headers({ "if-none-match": "*" }) }), null);
  });

  test("checksums are checked: a wrong one stores nothing and says so as R2 does", async () => {
    const wrong = "0".repeat(64);
    const refused = await rejection(BUCKET.put("checked", "payload", { sha256: wrong }));
    assert.equal(
      refused.message,
      `put: The SHA-256 checksum you specified did not match what we received.\nYou provided a SHA-256 checksum with value: ${wrong}\nActual SHA-256 was: ${sha256("payload")} (10037)`,
    );
    assert.equal(await BUCKET.head("checked"), null);
    const md5Bytes = createHash("md5").update("payload").digest();
    const stored = await BUCKET.put("checked", "payload", { md5: md5Bytes });
    assert.equal(stored.etag, md5("payload"));
    await assert.rejects(BUCKET.put("checked", "payload", { md5: md5Bytes, sha1: "0".repeat(40) }), {
      message: "You cannot specify multiple hashing algorithms.",
    });
  });

  test("list: prefixes, delimiters, pages by cursor, and metadata when asked for", async () => {
    for (const key of ["list/a", "list/b", "list/c/1", "list/c/2", "list/d"]) {
      await BUCKET.put(key, key, { customMetadata: { key } });
    }
    const grouped = await BUCKET.list({ prefix: "list/", delimiter: "/" });
    assert.deepEqual(
      grouped.objects.map((o) => o.key),
      ["list/a", "list/b", "list/d"],
    );
    assert.deepEqual(grouped.delimitedPrefixes, ["list/c/"]);
    assert.equal(grouped.truncated, false);

    const seen = [];
    let cursor;
    do {
      const page = await BUCKET.list({ prefix: "list/", limit: 2, cursor });
      assert.ok(page.objects.length <= 2);
      seen.push(...page.objects.map((o) => o.key));
      cursor = page.truncated ? page.cursor : undefined;
    } while (cursor !== undefined);
    assert.deepEqual(seen, ["list/a", "list/b", "list/c/1", "list/c/2", "list/d"]);

    const withMetadata = await BUCKET.list({ prefix: "list/a", include: ["customMetadata", "httpMetadata"] });
    assert.deepEqual(withMetadata.objects[0].customMetadata, { key: "list/a" });
    const after = await BUCKET.list({ prefix: "list/", startAfter: "list/c/2" });
    assert.deepEqual(
      after.objects.map((o) => o.key),
      ["list/d"],
    );
    await assert.rejects(BUCKET.list({ include: ["everything"] }), RangeError);
    const tooMany = await rejection(BUCKET.list({ limit: 1001 }));
    assert.equal(tooMany.message, "list: MaxKeys params must be positive integer <= 1000. (10022)");
  });

  test("delete takes one key or many; a missing key is not an error", async () => {
    await BUCKET.put("gone/1", "1");
    await BUCKET.put("gone/2", "2");
    await BUCKET.delete("gone/1");
    await BUCKET.delete(["gone/2", "gone/never-was"]);
    assert.deepEqual((await BUCKET.list({ prefix: "gone/" })).objects, []);
  });

  test("multipart: parts, completion into one object, resume, abort", async () => {
    const upload = await BUCKET.createMultipartUpload("multi", {
      httpMetadata: { contentType: "application/octet-stream" },
      customMetadata: { parts: "2" },
    });
    const first = randomBytes(5 * 1024 * 1024);
    const part1 = await upload.uploadPart(1, first);
    const resumed = BUCKET.resumeMultipartUpload("multi", upload.uploadId);
    const part2 = await resumed.uploadPart(2, "the end");
    const done = await resumed.complete([part1, part2]);
    assert.equal(done.size, first.length + 7);
    assert.match(done.etag, /-2$/);
    const got = await BUCKET.get("multi", { range: { suffix: 7 } });
    assert.equal(await got.text(), "the end");
    assert.deepEqual(got.customMetadata, { parts: "2" });
    assert.equal(got.httpMetadata.contentType, "application/octet-stream");

    const abandoned = await BUCKET.createMultipartUpload("abandoned");
    await abandoned.uploadPart(1, "x");
    await abandoned.abort();
    const afterAbort = await rejection(abandoned.uploadPart(2, "y"));
    assert.equal(afterAbort.message, "uploadPart: The specified multipart upload does not exist. (10024)");
    await assert.rejects(abandoned.uploadPart(0, "y"), {
      message: "Part number must be between 1 and 10000 (inclusive). Actual value was: 0",
    });
  });

  test("keys and metadata are checked as R2 checks them", async () => {
    const long = await rejection(BUCKET.put("k".repeat(1025), "x"));
    assert.equal(long.message, "put: The specified object name is not valid. (10020)");
    const metadata = await rejection(BUCKET.put("big-metadata", "x", { customMetadata: { m: "x".repeat(9000) } }));
    assert.equal(metadata.message, "put: Your metadata headers exceed the maximum allowed metadata size. (10012)");
  });

  test("a token limited to one bucket reaches only that bucket", async () => {
    await v4("POST", "/r2/buckets", { name: limitedBucket });
    const allowed = r2({ url, token: bucketToken, bucket: limitedBucket });
    assert.ok(await allowed.put("mine", "ok"));
    assert.equal(await (await allowed.get("mine")).text(), "ok");
    const other = r2({ url, token: bucketToken, bucket: await createBucket("node-r2-elsewhere") });
    const refused = await rejection(other.get("anything"));
    assert.equal(refused.message, "get: Authentication error (10000)");
    const missing = await rejection(r2({ ...connection, bucket: "no-such-bucket" }).get("x"));
    assert.match(missing.message, /^get: The specified bucket does not exist\. \(10006\)$/);
  });
});
