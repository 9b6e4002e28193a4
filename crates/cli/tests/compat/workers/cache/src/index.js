// A Worker over one KV namespace, as the KV guides write one: each route is one binding call,
// answered as JSON so the test can compare it with what wrangler reads and writes.

async function digest(buffer) {
  const hash = await crypto.subtle.digest("SHA-256", buffer);
  return [...new Uint8Array(hash)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function options(params) {
  const put = {};
  if (params.has("ttl")) put.expirationTtl = Number(params.get("ttl"));
  if (params.has("expiration")) put.expiration = Number(params.get("expiration"));
  if (params.has("metadata")) put.metadata = JSON.parse(params.get("metadata"));
  return put;
}

// A value of `n` bytes, streamed to `put` in 64 KiB pieces of unknown total length.
function generated(n) {
  let left = n;
  return new ReadableStream({
    pull(controller) {
      if (left === 0) return controller.close();
      const size = Math.min(left, 65536);
      left -= size;
      controller.enqueue(new Uint8Array(size).fill(97));
    },
  });
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const params = url.searchParams;
    const key = params.get("key");
    try {
      switch (url.pathname) {
        case "/put": {
          const value = params.has("value") ? params.get("value") : await request.arrayBuffer();
          await env.KV.put(key, value, options(params));
          return Response.json({ ok: true });
        }
        case "/put-generated": {
          // A stream of known length (FixedLengthStream) or of unknown length.
          const n = Number(params.get("bytes"));
          let body = generated(n);
          if (params.get("length") === "known") {
            const fixed = new FixedLengthStream(n);
            body.pipeTo(fixed.writable);
            body = fixed.readable;
          }
          await env.KV.put(key, body, options(params));
          return Response.json({ ok: true });
        }
        case "/get": {
          const type = params.get("type") ?? "text";
          const value = await env.KV.get(key, { type, cacheTtl: 60 });
          if (value === null) return Response.json({ value: null });
          if (type === "arrayBuffer") return Response.json({ bytes: value.byteLength, sha256: await digest(value) });
          if (type === "stream") {
            const buffer = await new Response(value).arrayBuffer();
            return Response.json({ bytes: buffer.byteLength, sha256: await digest(buffer) });
          }
          return Response.json({ value });
        }
        case "/meta": {
          const { value, metadata } = await env.KV.getWithMetadata(key, "text");
          return Response.json({ value, metadata });
        }
        case "/bulk": {
          const keys = params.getAll("key");
          const type = params.get("type") ?? "text";
          const found = params.has("withMetadata")
            ? await env.KV.getWithMetadata(keys, type)
            : await env.KV.get(keys, type);
          return Response.json(Object.fromEntries(found));
        }
        case "/delete":
          await env.KV.delete(key);
          return Response.json({ ok: true });
        case "/list": {
          const listed = await env.KV.list({
            prefix: params.get("prefix") ?? undefined,
            limit: params.has("limit") ? Number(params.get("limit")) : undefined,
            cursor: params.get("cursor") ?? undefined,
          });
          return Response.json(listed);
        }
        case "/list-all": {
          // The guides' loop: page with the cursor until list_complete.
          const names = [];
          let cursor, pages = 0;
          for (;;) {
            const page = await env.KV.list({ prefix: params.get("prefix") ?? undefined, cursor });
            pages += 1;
            names.push(...page.keys.map((k) => k.name));
            if (page.list_complete) break;
            cursor = page.cursor;
          }
          return Response.json({ pages, count: names.length, names });
        }
        case "/fill": {
          const n = Number(params.get("n"));
          const prefix = params.get("prefix") ?? "item:";
          await Promise.all(
            Array.from({ length: n }, (_, i) => env.KV.put(`${prefix}${String(i).padStart(5, "0")}`, `value ${i}`)),
          );
          return Response.json({ written: n });
        }
        default:
          return new Response("not found", { status: 404 });
      }
    } catch (e) {
      return Response.json({ error: e.message }, { status: 400 });
    }
  },
};
