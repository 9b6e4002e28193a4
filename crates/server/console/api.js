// How the console talks to kura: the v4 API (errors read from its envelope), the R2 binding
// protocol (for object details and multipart uploads with progress), and the few digests the
// protocols need (SHA-256 for S3 keys and presigned URLs, MD5 for D1's import etag).

const TOKEN_KEY = "kura.token";

/** The signed-in session: token (kept in this tab's sessionStorage only) and what it may do. */
export const session = {
  token: sessionStorage.getItem(TOKEN_KEY),
  account: null,
  tokenInfo: null,
  config: null,
};

export function forget() {
  sessionStorage.removeItem(TOKEN_KEY);
  session.token = null;
  session.account = null;
  session.tokenInfo = null;
}

/** Checks a token and, if it works, keeps it for this tab. */
export async function signIn(token) {
  session.token = token;
  try {
    session.tokenInfo = await v4("GET", "/user/tokens/verify");
    const accounts = await v4("GET", "/accounts");
    session.account = accounts.find((a) => a.id === session.tokenInfo.account_id) ?? accounts[0];
    session.config = await (await fetch("/console/config.json")).json();
  } catch (e) {
    forget();
    throw e;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
}

/** What the signed-in token may do: read and write per product. */
export function can(what) {
  const scope = session.tokenInfo?.scope;
  if (scope === "admin") return true;
  const [product, access] = what.split(":");
  if (!scope || !scope.startsWith(`${product}:`)) return false;
  return access === "read" || scope.endsWith(":write");
}

/** An error the API answered, worded as it worded it. */
export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authorization() {
  return { authorization: `Bearer ${session.token}` };
}

/** A v4 call under /client/v4: answers the envelope's `result` (or the whole envelope). */
export async function v4(method, path, body, { envelope = false } = {}) {
  const headers = authorization();
  let payload;
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(`/client/v4${path}`, { method, headers, body: payload });
  let json;
  try {
    json = await response.json();
  } catch {
    throw new ApiError(response.status, `${response.status} ${response.statusText}`);
  }
  if (!json.success) {
    const first = json.errors?.[0];
    throw new ApiError(response.status, first?.message ?? `${response.status} ${response.statusText}`, first?.code);
  }
  return envelope ? json : json.result;
}

/** The account's path prefix. */
export function acct(path) {
  return `/accounts/${encodeURIComponent(session.account.id)}${path}`;
}

/** An object's body, through the v4 API. */
export async function getObject(bucket, key) {
  const response = await fetch(`/client/v4${acct(`/r2/buckets/${encodeURIComponent(bucket)}/objects/${encodeKey(key)}`)}`, {
    headers: authorization(),
  });
  if (!response.ok) throw new ApiError(response.status, `download failed: ${response.status} ${response.statusText}`);
  return response.blob();
}

/** A key in a URL path: each segment escaped, slashes kept. */
export function encodeKey(key) {
  return key.split("/").map(encodeURIComponent).join("/");
}

// ---- The R2 binding protocol (what a Worker's env.BUCKET speaks) ----

/** JSON with everything past ASCII escaped, so it fits in a header. */
function asciiJson(value) {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

function bindingError(response, op) {
  let message = `${op}: ${response.status}`;
  const header = response.headers?.get ? response.headers.get("cf-r2-error") : response.getResponseHeader("cf-r2-error");
  if (header) {
    try {
      const parsed = JSON.parse(header);
      message = `${op}: ${parsed.message} (${parsed.v4code})`;
    } catch {
      // keep the status
    }
  }
  return new ApiError(response.status, message);
}

/** head/list: the request in a header, the reply's JSON first in the body. */
export async function r2Read(bucket, request) {
  const response = await fetch(`/binding/r2/${encodeURIComponent(bucket)}`, {
    headers: { ...authorization(), "cf-r2-request": asciiJson({ version: 1, ...request }) },
  });
  if (!response.ok) throw bindingError(response, request.method);
  const size = Number(response.headers.get("cf-r2-metadata-size") ?? 0);
  const body = new Uint8Array(await response.arrayBuffer());
  return JSON.parse(new TextDecoder().decode(body.subarray(0, size)));
}

/** put-like requests: the request's JSON, then the payload; `onProgress(sentBytes)` as it goes. */
export function r2Write(bucket, request, payload, onProgress) {
  const metadata = new TextEncoder().encode(JSON.stringify({ version: 1, ...request }));
  const body = payload ? new Blob([metadata, payload]) : new Blob([metadata]);
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", `/binding/r2/${encodeURIComponent(bucket)}`);
    xhr.setRequestHeader("authorization", `Bearer ${session.token}`);
    xhr.setRequestHeader("cf-r2-metadata-size", String(metadata.length));
    if (onProgress) xhr.upload.onprogress = (e) => onProgress(Math.max(0, e.loaded - metadata.length));
    xhr.onload = () => {
      if (xhr.status >= 400) return reject(bindingError(xhr, request.method));
      try {
        resolve(xhr.responseText ? JSON.parse(xhr.responseText) : {});
      } catch (e) {
        reject(e);
      }
    };
    xhr.onerror = () => reject(new ApiError(0, `${request.method}: the connection failed`));
    xhr.send(body);
  });
}

// ---- Digests ----

export function hex(buffer) {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export async function sha256Hex(data) {
  const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
  return hex(await crypto.subtle.digest("SHA-256", bytes));
}

async function hmac(key, data) {
  const k = await crypto.subtle.importKey("raw", typeof key === "string" ? new TextEncoder().encode(key) : key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return crypto.subtle.sign("HMAC", k, new TextEncoder().encode(data));
}

/** S3's escaping (RFC 3986 unreserved characters kept). */
function s3Escape(text, keepSlash) {
  return encodeURIComponent(text)
    .replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
    .replace(/%2F/g, keepSlash ? "/" : "%2F");
}

/**
 * A SigV4 presigned URL for an object on kura's S3 listener, signed in the browser with the
 * S3 key R2 derives from the signed-in token (id = the token's id, secret = SHA-256 of it).
 */
export async function presign({ endpoint, bucket, key, method = "GET", expires = 3600 }) {
  const accessKey = session.tokenInfo.id;
  const secret = await sha256Hex(session.token);
  const now = new Date();
  const stamp = now.toISOString().replace(/[-:]/g, "").replace(/\.\d{3}/, "");
  const day = stamp.slice(0, 8);
  const scope = `${day}/auto/s3/aws4_request`;
  const url = new URL(endpoint);
  const path = `/${s3Escape(bucket, false)}/${s3Escape(key, true)}`;
  const query = [
    ["X-Amz-Algorithm", "AWS4-HMAC-SHA256"],
    ["X-Amz-Credential", `${accessKey}/${scope}`],
    ["X-Amz-Date", stamp],
    ["X-Amz-Expires", String(expires)],
    ["X-Amz-SignedHeaders", "host"],
  ]
    .map(([k, v]) => `${s3Escape(k, false)}=${s3Escape(v, false)}`)
    .sort()
    .join("&");
  const canonical = [method, path, query, `host:${url.host}\n`, "host", "UNSIGNED-PAYLOAD"].join("\n");
  const toSign = ["AWS4-HMAC-SHA256", stamp, scope, await sha256Hex(canonical)].join("\n");
  let signingKey = await hmac(`AWS4${secret}`, day);
  for (const part of ["auto", "s3", "aws4_request"]) signingKey = await hmac(signingKey, part);
  const signature = hex(await hmac(signingKey, toSign));
  return `${url.origin}${path}?${query}&X-Amz-Signature=${signature}`;
}

/** MD5 of a Blob, read in slices (D1's import names its file by its MD5). */
export async function md5Hex(blob, onProgress) {
  const state = new Md5();
  const slice = 4 << 20;
  for (let offset = 0; offset < blob.size; offset += slice) {
    state.update(new Uint8Array(await blob.slice(offset, offset + slice).arrayBuffer()));
    onProgress?.(Math.min(offset + slice, blob.size));
  }
  return state.digest();
}

// RFC 1321, incrementally.
const S = [7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21];
// floor(|sin(i + 1)| × 2^32), written out: the spec lets Math.sin be approximate.
const K = [
  0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
  0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
  0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
  0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
  0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
  0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
  0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
  0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

class Md5 {
  constructor() {
    this.h = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476];
    this.buffer = new Uint8Array(64);
    this.filled = 0;
    this.length = 0;
  }

  update(bytes) {
    this.length += bytes.length;
    let i = 0;
    while (i < bytes.length) {
      const take = Math.min(64 - this.filled, bytes.length - i);
      this.buffer.set(bytes.subarray(i, i + take), this.filled);
      this.filled += take;
      i += take;
      if (this.filled === 64) {
        this.block(this.buffer);
        this.filled = 0;
      }
    }
  }

  block(chunk) {
    const m = new Uint32Array(16);
    for (let j = 0; j < 16; j++) m[j] = chunk[4 * j] | (chunk[4 * j + 1] << 8) | (chunk[4 * j + 2] << 16) | (chunk[4 * j + 3] << 24);
    let [a, b, c, d] = this.h;
    for (let j = 0; j < 64; j++) {
      let f;
      let g;
      if (j < 16) [f, g] = [(b & c) | (~b & d), j];
      else if (j < 32) [f, g] = [(d & b) | (~d & c), (5 * j + 1) % 16];
      else if (j < 48) [f, g] = [b ^ c ^ d, (3 * j + 5) % 16];
      else [f, g] = [c ^ (b | ~d), (7 * j) % 16];
      const rotate = S[(j >> 4) * 4 + (j % 4)];
      const sum = (a + f + K[j] + m[g]) >>> 0;
      [a, d, c] = [d, c, b];
      b = (b + ((sum << rotate) | (sum >>> (32 - rotate)))) >>> 0;
    }
    this.h = [(this.h[0] + a) >>> 0, (this.h[1] + b) >>> 0, (this.h[2] + c) >>> 0, (this.h[3] + d) >>> 0];
  }

  digest() {
    const bits = this.length * 8;
    const pad = new Uint8Array(((this.filled < 56 ? 56 : 120) - this.filled) + 8);
    pad[0] = 0x80;
    const view = new DataView(pad.buffer);
    view.setUint32(pad.length - 8, bits >>> 0, true);
    view.setUint32(pad.length - 4, Math.floor(bits / 2 ** 32), true);
    this.update(pad);
    return this.h.map((word) => [0, 8, 16, 24].map((s) => ((word >>> s) & 0xff).toString(16).padStart(2, "0")).join("")).join("");
  }
}
