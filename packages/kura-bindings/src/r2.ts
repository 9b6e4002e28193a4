// Cloudflare's R2Bucket for Node.js: the interface a Worker's `env.BUCKET` has, speaking R2's
// binding protocol (what workerd sends for `env.BUCKET`) to kura's `/binding/r2/{bucket}`.
// The checks workerd makes before sending, the JSON it sends and the way it reads replies and
// errors are done the same here, so a call fails or succeeds as it would in a Worker.

import { bytesOf, connect, fromHex, toHex, type Connection, type KuraConnection } from "./connection.js";
import type { Reply } from "./http.js";

export interface R2HTTPMetadata {
  contentType?: string;
  contentLanguage?: string;
  contentDisposition?: string;
  contentEncoding?: string;
  cacheControl?: string;
  cacheExpiry?: Date;
}

export interface R2StringChecksums {
  md5?: string;
  sha1?: string;
  sha256?: string;
  sha384?: string;
  sha512?: string;
}

export interface R2Checksums {
  readonly md5?: ArrayBuffer;
  readonly sha1?: ArrayBuffer;
  readonly sha256?: ArrayBuffer;
  readonly sha384?: ArrayBuffer;
  readonly sha512?: ArrayBuffer;
  toJSON(): R2StringChecksums;
}

export type R2Range = { offset: number; length?: number } | { offset?: number; length: number } | { suffix: number };

export interface R2Conditional {
  etagMatches?: string;
  etagDoesNotMatch?: string;
  uploadedBefore?: Date;
  uploadedAfter?: Date;
  secondsGranularity?: boolean;
}

export interface R2GetOptions {
  onlyIf?: R2Conditional | Headers;
  range?: R2Range | Headers;
  ssecKey?: ArrayBuffer | string;
}

type Digest = ArrayBuffer | ArrayBufferView | string;

export interface R2PutOptions {
  onlyIf?: R2Conditional | Headers;
  httpMetadata?: R2HTTPMetadata | Headers;
  customMetadata?: Record<string, string>;
  md5?: Digest;
  sha1?: Digest;
  sha256?: Digest;
  sha384?: Digest;
  sha512?: Digest;
  storageClass?: string;
  ssecKey?: ArrayBuffer | string;
}

export interface R2MultipartOptions {
  httpMetadata?: R2HTTPMetadata | Headers;
  customMetadata?: Record<string, string>;
  storageClass?: string;
  ssecKey?: ArrayBuffer | string;
}

export interface R2UploadPartOptions {
  ssecKey?: ArrayBuffer | string;
}

export interface R2ListOptions {
  limit?: number;
  prefix?: string;
  cursor?: string;
  delimiter?: string;
  startAfter?: string;
  include?: ("httpMetadata" | "customMetadata")[];
}

export interface R2UploadedPart {
  partNumber: number;
  etag: string;
}

export type R2Objects = { objects: R2Object[]; delimitedPrefixes: string[] } & (
  | { truncated: true; cursor: string }
  | { truncated: false }
);

export type R2PutValue = ReadableStream | ArrayBuffer | ArrayBufferView | string | null | Blob;

/** Where an R2 bucket is: a kura server and the bucket's name. */
export interface R2Options extends KuraConnection {
  bucket: string;
}

const REQUEST_HEADER = "cf-r2-request";
const METADATA_SIZE_HEADER = "cf-r2-metadata-size";
const ERROR_HEADER = "cf-r2-error";
const NOT_FOUND = 10007;
const PRECONDITION_FAILED = [10031, 10032];
/** Values up to this size are sent as one buffer with the request's JSON. */
const SMALL_PAYLOAD = 1 << 20;

/** What kura's replies describe an object with (workerd's HeadResponse). */
interface HeadJson {
  name: string;
  version: string;
  size: number | string;
  etag: string;
  uploaded: number | string;
  httpFields?: Record<string, string | number>;
  customFields?: { k: string; v: string }[];
  range?: { offset: number | string; length: number | string };
  checksums?: Record<string, string>;
  storageClass?: string;
  ssec?: { algorithm: string; keyMd5: string };
}

const CHECKSUM_KEYS: [string, keyof R2StringChecksums][] = [
  ["0", "md5"],
  ["1", "sha1"],
  ["2", "sha256"],
  ["3", "sha384"],
  ["4", "sha512"],
];

class Checksums implements R2Checksums {
  // Declared, not defined: only the digests the object has are its properties.
  declare readonly md5?: ArrayBuffer;
  declare readonly sha1?: ArrayBuffer;
  declare readonly sha256?: ArrayBuffer;
  declare readonly sha384?: ArrayBuffer;
  declare readonly sha512?: ArrayBuffer;
  readonly #hex: R2StringChecksums;

  constructor(json: Record<string, string> | undefined) {
    const hex: R2StringChecksums = {};
    for (const [key, name] of CHECKSUM_KEYS) {
      const value = json?.[key];
      const bytes = value === undefined ? undefined : fromHex(value);
      if (value !== undefined && bytes !== undefined) {
        hex[name] = value.toLowerCase();
        (this as Record<string, unknown>)[name] = bytes.slice().buffer;
      }
    }
    this.#hex = hex;
  }

  toJSON(): R2StringChecksums {
    return { ...this.#hex };
  }
}

/** An object's metadata, as `head`, `put`, `list` and a failed conditional `get` give it. */
export class R2Object {
  readonly key: string;
  readonly version: string;
  readonly size: number;
  readonly etag: string;
  readonly httpEtag: string;
  readonly checksums: R2Checksums;
  readonly uploaded: Date;
  readonly httpMetadata?: R2HTTPMetadata;
  readonly customMetadata?: Record<string, string>;
  readonly range?: R2Range;
  readonly storageClass: string;
  readonly ssecKeyMd5?: string;

  /** @internal */
  constructor(json: HeadJson) {
    this.key = json.name;
    this.version = json.version;
    this.size = Number(json.size);
    this.etag = json.etag;
    this.httpEtag = `"${json.etag}"`;
    this.checksums = new Checksums(json.checksums);
    this.uploaded = new Date(Number(json.uploaded));
    if (json.httpFields !== undefined) this.httpMetadata = httpMetadataOf(json.httpFields);
    if (json.customFields !== undefined) {
      this.customMetadata = Object.fromEntries(json.customFields.map(({ k, v }) => [k, v]));
    }
    if (json.range !== undefined) {
      this.range = { offset: Number(json.range.offset), length: Number(json.range.length) };
    }
    this.storageClass = json.storageClass ?? "";
    if (json.ssec !== undefined) this.ssecKeyMd5 = json.ssec.keyMd5;
  }

  /** Writes the object's HTTP metadata into `headers`, as a response serving it would carry. */
  writeHttpMetadata(headers: Headers): void {
    const http = this.httpMetadata ?? {};
    const set = (name: string, value: string | undefined) => {
      if (value !== undefined) headers.set(name, value);
    };
    set("content-type", http.contentType);
    set("content-language", http.contentLanguage);
    set("content-disposition", http.contentDisposition);
    set("content-encoding", http.contentEncoding);
    set("cache-control", http.cacheControl);
    set("expires", http.cacheExpiry?.toUTCString());
  }
}

/** An object with its bytes, as `get` gives it. */
export class R2ObjectBody extends R2Object {
  readonly #body: Response;

  /** @internal */
  constructor(json: HeadJson, body: ReadableStream<Uint8Array>) {
    super(json);
    this.#body = new Response(body);
  }

  get body(): ReadableStream {
    return this.#body.body ?? new Response(new Uint8Array()).body!;
  }

  get bodyUsed(): boolean {
    return this.#body.bodyUsed;
  }

  arrayBuffer(): Promise<ArrayBuffer> {
    return this.#body.arrayBuffer();
  }

  async bytes(): Promise<Uint8Array> {
    return new Uint8Array(await this.#body.arrayBuffer());
  }

  text(): Promise<string> {
    return this.#body.text();
  }

  json<T>(): Promise<T> {
    return this.#body.json() as Promise<T>;
  }

  blob(): Promise<Blob> {
    return this.#body.blob();
  }
}

function httpMetadataOf(fields: Record<string, string | number>): R2HTTPMetadata {
  const http: R2HTTPMetadata = {};
  for (const name of ["contentType", "contentLanguage", "contentDisposition", "contentEncoding", "cacheControl"]) {
    if (fields[name] !== undefined) (http as Record<string, unknown>)[name] = String(fields[name]);
  }
  if (fields.cacheExpiry !== undefined) http.cacheExpiry = new Date(Number(fields.cacheExpiry));
  return http;
}

/** JSON whose non-ASCII characters are escaped: header values must be ASCII. */
function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

function httpFieldsOf(metadata: R2HTTPMetadata | Headers | undefined): Record<string, string> | undefined {
  if (metadata === undefined) return undefined;
  const fields: Record<string, string> = {};
  if (metadata instanceof Headers) {
    const names: [string, string][] = [
      ["content-type", "contentType"],
      ["content-language", "contentLanguage"],
      ["content-disposition", "contentDisposition"],
      ["content-encoding", "contentEncoding"],
      ["cache-control", "cacheControl"],
    ];
    for (const [header, field] of names) {
      const value = metadata.get(header);
      if (value !== null) fields[field] = value;
    }
    const expires = metadata.get("expires");
    if (expires !== null && !Number.isNaN(Date.parse(expires))) fields.cacheExpiry = String(Date.parse(expires));
    return fields;
  }
  for (const [field, value] of Object.entries(metadata)) {
    if (value === undefined) continue;
    fields[field] = value instanceof Date ? String(value.getTime()) : String(value);
  }
  return fields;
}

function customFieldsOf(metadata: Record<string, string> | undefined): { k: string; v: string }[] | undefined {
  if (metadata === undefined) return undefined;
  return Object.entries(metadata).map(([k, v]) => ({ k, v: String(v) }));
}

type EtagCondition = { type: "wildcard" } | { type: "strong" | "weak"; value: string };

/** An If-Match / If-None-Match list (`"a", W/"b"`, or `*`), or a bare etag. */
function etagConditions(text: string): EtagCondition[] {
  const out: EtagCondition[] = [];
  let rest = text.trim();
  while (rest.length > 0) {
    let weak = false;
    if (rest.startsWith("*")) {
      return [{ type: "wildcard" }];
    }
    if (rest.startsWith("W/")) {
      weak = true;
      rest = rest.slice(2);
      if (!rest.startsWith('"')) throw new TypeError("Weak etags must start with W/ and their value must be quoted");
    }
    let value: string;
    if (rest.startsWith('"')) {
      const end = rest.indexOf('"', 1);
      if (end === -1) throw new TypeError("Unclosed double quote for Etag");
      value = rest.slice(1, end);
      rest = rest.slice(end + 1);
    } else {
      const end = rest.indexOf(",");
      value = (end === -1 ? rest : rest.slice(0, end)).trim();
      rest = end === -1 ? "" : rest.slice(end);
    }
    out.push({ type: weak ? "weak" : "strong", value });
    rest = rest.trim();
    if (rest.startsWith(",")) rest = rest.slice(1).trim();
    else if (rest.length > 0) throw new TypeError("Comma was expected to separate etags");
  }
  return out;
}

function conditionalOf(onlyIf: R2Conditional | Headers | undefined): Record<string, unknown> | undefined {
  if (onlyIf === undefined) return undefined;
  const out: Record<string, unknown> = {};
  if (onlyIf instanceof Headers) {
    const ifMatch = onlyIf.get("if-match");
    const ifNoneMatch = onlyIf.get("if-none-match");
    const modified = onlyIf.get("if-modified-since");
    const unmodified = onlyIf.get("if-unmodified-since");
    if (ifMatch !== null) out.etagMatches = etagConditions(ifMatch);
    if (ifNoneMatch !== null) out.etagDoesNotMatch = etagConditions(ifNoneMatch);
    if (modified !== null && !Number.isNaN(Date.parse(modified))) out.uploadedAfter = String(Date.parse(modified));
    if (unmodified !== null && !Number.isNaN(Date.parse(unmodified))) {
      out.uploadedBefore = String(Date.parse(unmodified));
    }
    if (modified !== null || unmodified !== null) out.secondsGranularity = true;
    return out;
  }
  if (onlyIf.etagMatches !== undefined) out.etagMatches = etagConditions(onlyIf.etagMatches);
  if (onlyIf.etagDoesNotMatch !== undefined) out.etagDoesNotMatch = etagConditions(onlyIf.etagDoesNotMatch);
  if (onlyIf.uploadedBefore !== undefined) out.uploadedBefore = String(onlyIf.uploadedBefore.getTime());
  if (onlyIf.uploadedAfter !== undefined) out.uploadedAfter = String(onlyIf.uploadedAfter.getTime());
  if (onlyIf.secondsGranularity) out.secondsGranularity = true;
  return out;
}

function checkRangeNumber(what: string, name: string, value: number): void {
  if (!Number.isInteger(value)) {
    throw new TypeError(`Invalid ${what}. ${name} (${value}) must be an integer, not floating point.`);
  }
  if (value < 0) {
    throw new RangeError(`Invalid ${what}. ${name} (${value}) must be greater than or equal to 0.`);
  }
}

function rangeOf(range: R2Range | Headers | undefined): Record<string, unknown> {
  if (range === undefined) return {};
  if (range instanceof Headers) {
    const header = range.get("range");
    return header === null ? {} : { rangeHeader: header };
  }
  const { offset, length, suffix } = range as { offset?: number; length?: number; suffix?: number };
  const out: Record<string, string> = {};
  if (suffix !== undefined) {
    if (offset !== undefined) throw new TypeError("Suffix is incompatible with offset.");
    if (length !== undefined) throw new TypeError("Suffix is incompatible with length.");
    checkRangeNumber("suffix", "Suffix", suffix);
    out.suffix = String(suffix);
  }
  if (offset !== undefined) {
    checkRangeNumber("range", "Starting offset", offset);
    out.offset = String(offset);
  }
  if (length !== undefined) {
    checkRangeNumber("range", "Length", length);
    out.length = String(length);
  }
  return { range: out };
}

const DIGESTS: [keyof R2PutOptions, string, number][] = [
  ["md5", "MD5", 16],
  ["sha1", "SHA-1", 20],
  ["sha256", "SHA-256", 32],
  ["sha384", "SHA-384", 48],
  ["sha512", "SHA-512", 64],
];

/** The one digest a put names, in the request's encoding (md5 base64, the others hex). */
function digestOf(options: R2PutOptions): Record<string, string> {
  const given = DIGESTS.filter(([name]) => options[name] !== undefined);
  if (given.length > 1) throw new TypeError("You cannot specify multiple hashing algorithms.");
  const [found] = given;
  if (found === undefined) return {};
  const [name, label, size] = found;
  const value = options[name] as Digest;
  let bytes: Uint8Array;
  if (typeof value === "string") {
    if (value.length !== size * 2) throw new TypeError(`${label} is ${size * 2} hex characters, not ${value.length}`);
    const decoded = fromHex(value);
    if (decoded === undefined) throw new TypeError(`Provided ${label} wasn't a valid hex string`);
    bytes = decoded;
  } else {
    bytes = bytesOf(value);
    if (bytes.length !== size) throw new TypeError(`${label} is ${size} bytes, not ${bytes.length}`);
  }
  const encoded = name === "md5" ? btoa(String.fromCharCode(...bytes)) : toHex(bytes);
  return { [name]: encoded };
}

function refuseSsec(ssecKey: unknown): void {
  if (ssecKey !== undefined) {
    throw new TypeError("kura-bindings: SSE-C keys are not supported by kura");
  }
}

function checkPartNumber(n: number): void {
  if (!Number.isInteger(n) || n < 1 || n > 10000) {
    throw new TypeError(`Part number must be between 1 and 10000 (inclusive). Actual value was: ${n}`);
  }
}

/** A reply's R2 error: `{v4code, message}` from `cf-r2-error`. */
interface R2ErrorJson {
  v4code: number;
  message: string;
}

function errorOf(response: Reply): R2ErrorJson {
  const header = response.header(ERROR_HEADER);
  if (header !== null) {
    try {
      const parsed = JSON.parse(header) as Partial<R2ErrorJson>;
      return { v4code: Number(parsed.v4code ?? 0), message: String(parsed.message ?? "Unspecified error") };
    } catch {
      // As workerd does with a header it cannot read.
    }
  }
  return { v4code: 0, message: "Unspecified error" };
}

/** Splits the first `size` bytes (the reply's JSON) off a body; the rest streams on. */
async function splitBody(
  body: ReadableStream<Uint8Array>,
  size: number,
): Promise<[Uint8Array, ReadableStream<Uint8Array>]> {
  const reader = body.getReader();
  const head = new Uint8Array(size);
  let filled = 0;
  let leftover: Uint8Array | undefined;
  while (filled < size) {
    const { done, value } = await reader.read();
    if (done) throw new Error(`R2 reply ended inside its metadata (${filled} of ${size} bytes)`);
    const take = Math.min(size - filled, value.length);
    head.set(value.subarray(0, take), filled);
    filled += take;
    if (take < value.length) leftover = value.subarray(take);
  }
  return [head, prefixed(leftover, reader)];
}

function r2Error(op: string, error: R2ErrorJson): Error {
  return new Error(`${op}: ${error.message} (${error.v4code})`);
}

/** Sends one bucket's requests. */
class Transport {
  readonly #connection: Connection;
  readonly #url: string;

  constructor(connection: Connection, bucket: string) {
    this.#connection = connection;
    this.#url = `${connection.url}/binding/r2/${encodeURIComponent(bucket)}`;
  }

  /** head, get, list: the request in a header, the reply's JSON and then its bytes. */
  async read(request: Record<string, unknown>): Promise<Reply> {
    const headers = {
      authorization: this.#connection.authorization,
      [REQUEST_HEADER]: asciiJson({ version: 1, ...request }),
    };
    return this.#connection.send("GET", this.#url, headers);
  }

  /** put, delete, multipart: the request's JSON and then the payload, with a known length. */
  async write(request: Record<string, unknown>, payload?: Blob | ReadableStream<Uint8Array>): Promise<Reply> {
    const metadata = new TextEncoder().encode(JSON.stringify({ version: 1, ...request }));
    const headers: Record<string, string> = {
      authorization: this.#connection.authorization,
      [METADATA_SIZE_HEADER]: String(metadata.length),
    };
    let body: Uint8Array | Blob | ReadableStream<Uint8Array>;
    if (payload === undefined) {
      body = metadata;
    } else if (payload instanceof ReadableStream) {
      body = prefixed(metadata, payload.getReader());
    } else if (payload.size <= SMALL_PAYLOAD) {
      // Small values go in one piece: cheaper than streaming a Blob.
      body = new Uint8Array(metadata.length + payload.size);
      body.set(metadata);
      body.set(new Uint8Array(await payload.arrayBuffer()), metadata.length);
    } else {
      body = new Blob([metadata, payload]);
    }
    return this.#connection.send("PUT", this.#url, headers, body);
  }
}

/** `prefix` (if any), then what `reader` reads: a stream whose start was already taken, or
 * that a header must precede. */
function prefixed(prefix: Uint8Array | undefined, reader: ReadableStreamDefaultReader<Uint8Array>): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    start(controller) {
      if (prefix !== undefined) controller.enqueue(prefix);
    },
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}

/** A put's or part's value as a Blob (known length) or, for a stream, the stream itself. */
function payloadOf(value: R2PutValue): Blob | ReadableStream<Uint8Array> {
  if (value === null) return new Blob([]);
  if (typeof value === "string") return new Blob([value]);
  if (value instanceof Blob) return value;
  if (value instanceof ReadableStream) return value as ReadableStream<Uint8Array>;
  if (value instanceof ArrayBuffer || ArrayBuffer.isView(value)) return new Blob([bytesOf(value).slice()]);
  throw new TypeError(
    "kura-bindings: a value must be a ReadableStream, ArrayBuffer, ArrayBufferView, string, Blob or null",
  );
}

async function replyJson<T>(response: Reply): Promise<T> {
  return JSON.parse(await response.text()) as T;
}

/** An upload in parts, as `createMultipartUpload` and `resumeMultipartUpload` give it. */
export class R2MultipartUpload {
  readonly key: string;
  readonly uploadId: string;
  readonly #transport: Transport;

  /** @internal */
  constructor(transport: Transport, key: string, uploadId: string) {
    this.#transport = transport;
    this.key = key;
    this.uploadId = uploadId;
  }

  async uploadPart(
    partNumber: number,
    value: ReadableStream | ArrayBuffer | ArrayBufferView | string | Blob,
    options?: R2UploadPartOptions,
  ): Promise<R2UploadedPart> {
    checkPartNumber(partNumber);
    refuseSsec(options?.ssecKey);
    const request = { method: "uploadPart", object: this.key, uploadId: this.uploadId, partNumber };
    const response = await this.#transport.write(request, payloadOf(value));
    if (response.status >= 400) throw r2Error("uploadPart", errorOf(response));
    const { etag } = await replyJson<{ etag: string }>(response);
    return { partNumber, etag };
  }

  async abort(): Promise<void> {
    const request = { method: "abortMultipartUpload", object: this.key, uploadId: this.uploadId };
    const response = await this.#transport.write(request);
    await response.discard();
    if (response.status >= 400) {
      const error = errorOf(response);
      if (error.v4code !== NOT_FOUND) throw r2Error("abortMultipartUpload", error);
    }
  }

  async complete(uploadedParts: R2UploadedPart[]): Promise<R2Object> {
    for (const part of uploadedParts) checkPartNumber(part.partNumber);
    const parts = uploadedParts.map((p) => ({ etag: p.etag, part: p.partNumber }));
    const request = { method: "completeMultipartUpload", object: this.key, uploadId: this.uploadId, parts };
    const response = await this.#transport.write(request);
    if (response.status >= 400) throw r2Error("completeMultipartUpload", errorOf(response));
    return new R2Object(await replyJson<HeadJson>(response));
  }
}

/** An R2 bucket on a kura server, with the methods of a Worker's `env.BUCKET`. */
export class R2Bucket {
  readonly #transport: Transport;

  /** @internal */
  constructor(transport: Transport) {
    this.#transport = transport;
  }

  async head(key: string): Promise<R2Object | null> {
    const response = await this.#transport.read({ method: "head", object: key });
    const reply = await this.#readReply("head", response, false);
    return reply === null ? null : new R2Object(reply.head);
  }

  get(key: string, options: R2GetOptions & { onlyIf: R2Conditional | Headers }): Promise<R2ObjectBody | R2Object | null>;
  get(key: string, options?: R2GetOptions): Promise<R2ObjectBody | null>;
  async get(key: string, options?: R2GetOptions): Promise<R2ObjectBody | R2Object | null> {
    refuseSsec(options?.ssecKey);
    const request: Record<string, unknown> = { method: "get", object: key, ...rangeOf(options?.range) };
    const onlyIf = conditionalOf(options?.onlyIf);
    if (onlyIf !== undefined) request.onlyIf = onlyIf;
    const response = await this.#transport.read(request);
    const reply = await this.#readReply("get", response, true);
    if (reply === null) return null;
    if (reply.failedCondition) return new R2Object(reply.head);
    return new R2ObjectBody(reply.head, reply.body);
  }

  put(
    key: string,
    value: R2PutValue,
    options?: R2PutOptions & { onlyIf: R2Conditional | Headers },
  ): Promise<R2Object | null>;
  put(key: string, value: R2PutValue, options?: R2PutOptions): Promise<R2Object>;
  async put(key: string, value: R2PutValue, options?: R2PutOptions): Promise<R2Object | null> {
    refuseSsec(options?.ssecKey);
    const httpFields = httpFieldsOf(options?.httpMetadata);
    const customFields = customFieldsOf(options?.customMetadata);
    const request: Record<string, unknown> = { method: "put", object: key, ...digestOf(options ?? {}) };
    if (httpFields !== undefined) request.httpFields = httpFields;
    if (customFields !== undefined) request.customFields = customFields;
    const onlyIf = conditionalOf(options?.onlyIf);
    if (onlyIf !== undefined) request.onlyIf = onlyIf;
    if (options?.storageClass !== undefined) request.storageClass = options.storageClass;
    const response = await this.#transport.write(request, payloadOf(value));
    if (response.status >= 400) {
      await response.discard();
      const error = errorOf(response);
      if (PRECONDITION_FAILED.includes(error.v4code)) return null;
      throw r2Error("put", error);
    }
    const head = await replyJson<HeadJson>(response);
    // As workerd does: the object's metadata is what this put sent.
    head.httpFields = httpFields ?? {};
    head.customFields = customFields ?? [];
    return new R2Object(head);
  }

  async createMultipartUpload(key: string, options?: R2MultipartOptions): Promise<R2MultipartUpload> {
    refuseSsec(options?.ssecKey);
    const request: Record<string, unknown> = { method: "createMultipartUpload", object: key };
    const httpFields = httpFieldsOf(options?.httpMetadata);
    const customFields = customFieldsOf(options?.customMetadata);
    if (httpFields !== undefined) request.httpFields = httpFields;
    if (customFields !== undefined) request.customFields = customFields;
    if (options?.storageClass !== undefined) request.storageClass = options.storageClass;
    const response = await this.#transport.write(request);
    if (response.status >= 400) throw r2Error("createMultipartUpload", errorOf(response));
    const { uploadId } = await replyJson<{ uploadId: string }>(response);
    return new R2MultipartUpload(this.#transport, key, uploadId);
  }

  resumeMultipartUpload(key: string, uploadId: string): R2MultipartUpload {
    return new R2MultipartUpload(this.#transport, key, uploadId);
  }

  async delete(keys: string | string[]): Promise<void> {
    const request = Array.isArray(keys) ? { method: "delete", objects: keys } : { method: "delete", object: keys };
    const response = await this.#transport.write(request);
    await response.discard();
    if (response.status >= 400) {
      const error = errorOf(response);
      if (error.v4code !== NOT_FOUND) throw r2Error("delete", error);
    }
  }

  async list(options?: R2ListOptions): Promise<R2Objects> {
    const request: Record<string, unknown> = { method: "list", newRuntime: true };
    if (options?.limit !== undefined) request.limit = options.limit;
    for (const name of ["prefix", "cursor", "delimiter", "startAfter"] as const) {
      if (options?.[name] !== undefined) request[name] = options[name];
    }
    if (options?.include !== undefined) {
      request.include = options.include.map((what) => {
        if (what === "httpMetadata") return 0;
        if (what === "customMetadata") return 1;
        throw new RangeError(`Unsupported include value ${String(what)}`);
      });
    }
    const response = await this.#transport.read(request);
    const reply = await this.#readReply("list", response, false);
    if (reply === null) throw r2Error("list", { v4code: NOT_FOUND, message: "The specified key does not exist." });
    const json = reply.head as unknown as {
      objects: HeadJson[];
      truncated: boolean;
      cursor?: string;
      delimitedPrefixes?: string[];
    };
    const objects = json.objects.map((o) => new R2Object(o));
    const delimitedPrefixes = json.delimitedPrefixes ?? [];
    if (json.truncated) return { objects, delimitedPrefixes, truncated: true, cursor: json.cursor ?? "" };
    return { objects, delimitedPrefixes, truncated: false };
  }

  /** A read method's reply: null for a missing object, or its JSON and the bytes after it. */
  async #readReply(
    op: string,
    response: Reply,
    withBody: boolean,
  ): Promise<{ head: HeadJson; body: ReadableStream<Uint8Array>; failedCondition: boolean } | null> {
    const sizeHeader = response.header(METADATA_SIZE_HEADER);
    if (response.status >= 400) {
      const error = errorOf(response);
      if (error.v4code === NOT_FOUND) {
        await response.discard();
        return null;
      }
      if (op === "get" && PRECONDITION_FAILED.includes(error.v4code) && sizeHeader !== null) {
        const [head, rest] = await splitBody(response.body(), Number(sizeHeader));
        await rest.cancel();
        return { head: JSON.parse(new TextDecoder().decode(head)) as HeadJson, body: emptyStream(), failedCondition: true };
      }
      await response.discard();
      throw r2Error(op, error);
    }
    const size = Number(sizeHeader);
    if (sizeHeader === null || !Number.isInteger(size) || size < 0 || size > 1 << 20) {
      await response.discard();
      throw r2Error(op, { v4code: 10001, message: "We encountered an internal error. Please try again." });
    }
    const [head, body] = await splitBody(response.body(), size);
    if (!withBody) await body.cancel();
    return { head: JSON.parse(new TextDecoder().decode(head)) as HeadJson, body, failedCondition: false };
  }
}

function emptyStream(): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({ start: (c) => c.close() });
}

/** The R2 bucket `options.bucket` on the kura server `options.url`, as an `R2Bucket`. */
export function r2(options: R2Options): R2Bucket {
  if (typeof options?.bucket !== "string" || options.bucket === "") {
    throw new TypeError("kura-bindings: r2() needs `bucket`, a bucket's name");
  }
  return new R2Bucket(new Transport(connect(options), options.bucket));
}
