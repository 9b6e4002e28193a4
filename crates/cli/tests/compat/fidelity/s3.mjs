// Sends the same S3 requests, in the same order, to Miniflare's R2 S3 endpoint (real workerd
// running Cloudflare's own emulation of R2's S3 API) and to kura's S3 listener, and prints what
// each side answered: the oracle for fidelity.rs's S3 test. Requests are signed with aws4fetch
// (SigV4), each side with its own key; a case can take a value (an upload id, an ETag) from an
// earlier answer on the same side, as `${name}` in its path, query, headers or body.
// Usage: node s3.mjs <miniflare module> <aws4fetch module> <cases.json> <kura S3 URL> <key id> <secret>
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

const [miniflarePath, aws4fetchPath, casesPath, kuraUrl, kuraKey, kuraSecret] = process.argv.slice(2);
const { Miniflare } = await import(miniflarePath);
const { AwsClient } = await import(aws4fetchPath);
const cases = JSON.parse(readFileSync(casesPath, "utf8"));
const BUCKET = "fidelity";

const mf = new Miniflare({
  modules: true,
  script: "export default { fetch() { return new Response('') } }",
  compatibilityDate: "2026-01-01",
  r2Buckets: { B: { id: BUCKET, s3Credentials: { accessKeyId: "oracle-key", secretAccessKey: "oracle-secret" } } },
});

// The headers both sides are compared on (besides the status and the body).
const COMPARED = [
  "etag", "content-length", "content-range", "content-type", "cache-control", "content-disposition",
  "content-encoding", "content-language", "expires", "accept-ranges", "x-amz-mp-parts-count",
  "x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-crc64nvme", "x-amz-checksum-sha1",
  "x-amz-checksum-sha256", "x-amz-checksum-type", "x-amz-version-id", "x-amz-storage-class",
  "x-amz-missing-meta",
];

const substitute = (text, values) =>
  typeof text === "string" ? text.replace(/\$\{(\w+)\}/g, (_, name) => values[name] ?? `<no ${name}>`) : text;

function bodyOf(c, values) {
  if (c.body_repeat) return c.body_repeat.char.repeat(c.body_repeat.count);
  return substitute(c.body, values);
}

async function send(side, c) {
  const query = new URLSearchParams(
    Object.entries(c.query || {}).map(([k, v]) => [k, substitute(v, side.values)]),
  ).toString();
  const path = c.key === undefined ? `/${BUCKET}` : `/${BUCKET}/${encodeURIComponent(substitute(c.key, side.values)).replaceAll("%2F", "/")}`;
  const url = `${side.base}${path}${query ? `?${query}` : ""}`;
  const headers = Object.fromEntries(Object.entries(c.headers || {}).map(([k, v]) => [k, substitute(v, side.values)]));
  let body = c.method === "GET" || c.method === "HEAD" ? undefined : bodyOf(c, side.values);
  if (c.content_md5) headers["content-md5"] = createHash("md5").update(body ?? "").digest("base64");
  let request;
  if (c.auth === "none") {
    request = new Request(url, { method: c.method, headers, body });
  } else if (c.auth === "presigned" || c.auth === "presigned-tampered") {
    const signed = await side.client.sign(`${url}${query ? "&" : "?"}X-Amz-Expires=600`, {
      method: c.method, headers, aws: { signQuery: true },
    });
    let signedUrl = signed.url;
    if (c.auth === "presigned-tampered") {
      signedUrl = signedUrl.replace(/X-Amz-Signature=([0-9a-f])/, (_, d) => `X-Amz-Signature=${d === "0" ? "1" : "0"}`);
    }
    request = new Request(signedUrl, { method: c.method, headers, body });
  } else if (c.auth === "wrong-secret") {
    request = await side.wrongSecret.sign(url, { method: c.method, headers, body });
  } else {
    request = await side.client.sign(url, { method: c.method, headers, body });
  }
  if (c.chunked) {
    // A body of unknown length: fetch sends it with Transfer-Encoding: chunked.
    const bytes = new TextEncoder().encode(body);
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(bytes.slice(0, 3));
        controller.enqueue(bytes.slice(3));
        controller.close();
      },
    });
    request = new Request(request.url, { method: request.method, headers: request.headers, body: stream, duplex: "half" });
  }
  let response;
  try {
    response = await fetch(request);
  } catch (e) {
    // Miniflare may close the connection on a body it refuses before the body is all sent;
    // its answer to such a case is not compared (kura's status is checked alone), and any
    // other case fails on the status 0 recorded here.
    if (!side.oracle) throw e;
    return { status: 0, headers: {}, body: `no answer: ${e.cause?.code ?? e.message}` };
  }
  const text = await response.text();
  const picked = {};
  for (const name of COMPARED) {
    const value = response.headers.get(name);
    if (value !== null) picked[name] = value;
  }
  for (const [name, value] of response.headers) {
    if (name.startsWith("x-amz-meta-")) picked[name] = value;
  }
  for (const [name, pattern] of Object.entries(c.capture || {})) {
    const found = name.startsWith("header:") ? response.headers.get(pattern) : text.match(new RegExp(pattern))?.[1];
    if (found != null) side.values[name.replace(/^header:/, "")] = found;
  }
  return { status: response.status, headers: picked, body: text };
}

try {
  const mfBase = new URL("/cdn-cgi/local/r2/s3", await mf.ready).toString();
  const client = (accessKeyId, secretAccessKey) =>
    new AwsClient({ accessKeyId, secretAccessKey, service: "s3", region: "auto" });
  const sides = [
    {
      base: mfBase,
      client: client("oracle-key", "oracle-secret"),
      wrongSecret: client("oracle-key", "nope"),
      values: {},
      oracle: true,
    },
    { base: kuraUrl, client: client(kuraKey, kuraSecret), wrongSecret: client(kuraKey, "nope"), values: {} },
  ];
  // kura's bucket is made here; Miniflare's exists by configuration.
  const made = await fetch(await sides[1].client.sign(`${kuraUrl}/${BUCKET}`, { method: "PUT" }));
  if (made.status !== 200) throw new Error(`creating kura's bucket: ${made.status} ${await made.text()}`);
  const out = [];
  for (const c of cases) {
    const answers = [];
    for (const side of sides) answers.push(await send(side, c));
    out.push({ oracle: answers[0], kura: answers[1] });
  }
  process.stdout.write(JSON.stringify(out));
} finally {
  await mf.dispose();
}
