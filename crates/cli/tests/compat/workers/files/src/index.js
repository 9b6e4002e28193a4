// Every method of the R2 binding, each answered as JSON: what the Worker saw.
const json = (value, status = 200) => Response.json(value, { status });
const hex = (bytes) => [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");
const describe = (o) =>
  o && {
    key: o.key,
    size: o.size,
    etag: o.etag,
    httpEtag: o.httpEtag,
    version: o.version,
    uploaded: o.uploaded.getTime(),
    httpMetadata: o.httpMetadata,
    customMetadata: o.customMetadata,
    range: o.range,
    storageClass: o.storageClass,
    checksums: { md5: o.checksums.md5 && hex(o.checksums.md5), sha256: o.checksums.sha256 && hex(o.checksums.sha256) },
    hasBody: "body" in o,
  };
const attempt = async (f) => {
  try {
    return { ok: await f() };
  } catch (e) {
    return { error: `${e.name}: ${e.message}` };
  }
};

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const key = decodeURIComponent(url.pathname.slice("/objects/".length));
    const q = url.searchParams;
    const out = {};
    switch (url.pathname.startsWith("/objects/") ? "/objects" : url.pathname) {
      case "/objects":
        if (request.method === "PUT") {
          const put = await env.FILES.put(key, request.body, {
            httpMetadata: { contentType: q.get("type") ?? undefined, cacheControl: "max-age=60" },
            customMetadata: q.get("meta") ? JSON.parse(q.get("meta")) : undefined,
            onlyIf: q.get("ifMatch") ? { etagMatches: q.get("ifMatch") } : undefined,
            sha256: q.get("sha256") ?? undefined,
          });
          return json(describe(put));
        }
        if (request.method === "DELETE") return json(await env.FILES.delete(key));
        if (q.get("head")) return json(describe(await env.FILES.head(key)));
        {
          const options = {};
          if (q.get("offset") || q.get("length")) {
            options.range = {};
            if (q.get("offset")) options.range.offset = Number(q.get("offset"));
            if (q.get("length")) options.range.length = Number(q.get("length"));
          }
          if (q.get("suffix")) options.range = { suffix: Number(q.get("suffix")) };
          if (q.get("rangeHeader")) options.range = new Headers({ range: q.get("rangeHeader") });
          if (q.get("ifNoneMatch")) options.onlyIf = { etagDoesNotMatch: q.get("ifNoneMatch") };
          const got = await attempt(() => env.FILES.get(key, options));
          if (got.error) return json(got, 400);
          const object = got.ok;
          if (!object) return json(null, 404);
          return json({ ...describe(object), text: "body" in object ? await object.text() : null });
        }
      case "/list": {
        const options = {};
        for (const name of ["prefix", "delimiter", "cursor", "startAfter"]) if (q.get(name)) options[name] = q.get(name);
        if (q.get("limit")) options.limit = Number(q.get("limit"));
        if (q.get("include")) options.include = q.get("include").split(",");
        const page = await attempt(() => env.FILES.list(options));
        if (page.error) return json(page, 400);
        const { objects, truncated, cursor, delimitedPrefixes } = page.ok;
        return json({ keys: objects.map((o) => o.key), objects: objects.map(describe), truncated, cursor, delimitedPrefixes });
      }
      case "/delete-many":
        await env.FILES.delete(await request.json());
        return json({ ok: true });
      case "/multipart": {
        const upload = await env.FILES.createMultipartUpload(q.get("key"), {
          httpMetadata: { contentType: "application/octet-stream" },
          customMetadata: { parts: "2" },
        });
        const resumed = env.FILES.resumeMultipartUpload(upload.key, upload.uploadId);
        const first = await resumed.uploadPart(1, new Uint8Array(5 * 1024 * 1024).fill(97));
        const second = await upload.uploadPart(2, "tail");
        out.badPart = await attempt(() => upload.uploadPart(0, "x"));
        out.object = describe(await upload.complete([first, second]));
        const aborted = await env.FILES.createMultipartUpload("aborted");
        await aborted.uploadPart(1, "never");
        await aborted.abort();
        out.completeAborted = await attempt(() => aborted.complete([{ partNumber: 1, etag: "x" }]));
        return json(out);
      }
      case "/errors":
        out.badDigest = await attempt(() => env.FILES.put("digest", "hello", { sha256: "0".repeat(64) }));
        out.unknownLength = await attempt(() =>
          env.FILES.put("stream", new ReadableStream({ start: (c) => (c.enqueue(new Uint8Array([1])), c.close()) })),
        );
        out.failedPut = await attempt(async () => describe(await env.FILES.put("digest", "x", { onlyIf: { etagMatches: "nope" } })));
        out.badRange = await attempt(() => env.FILES.get("small", { range: { offset: 100, length: 1 } }));
        out.badLimit = await attempt(() => env.FILES.list({ limit: 5000 }));
        out.longKey = await attempt(() => env.FILES.put("k".repeat(1025), "x"));
        out.digestStored = describe(await env.FILES.head("digest"));
        return json(out);
      default:
        return new Response("not found", { status: 404 });
    }
  },
};
