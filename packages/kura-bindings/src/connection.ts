// Where a kura server is and how to authenticate to it: what d1() and r2() share.

import { sendWithFetch, sendWithUndici, type Send } from "./http.js";

/** How to reach a kura server. */
export interface KuraConnection {
  /**
   * The server's API listener, e.g. `http://127.0.0.1:8780`. Defaults to `KURA_URL` from the
   * environment, then to the origin of `CLOUDFLARE_API_BASE_URL` (what wrangler is pointed at
   * kura with), then to `http://127.0.0.1:8780` (what `kura serve` listens on).
   */
  url?: string;
  /**
   * An API token of the account (`kura tokens create`, or the admin token `kura serve` printed).
   * Defaults to `KURA_API_TOKEN`, then `CLOUDFLARE_API_TOKEN`, from the environment.
   */
  token?: string;
  /**
   * A `fetch` to send requests with. By default requests go through undici directly (what Node's
   * `fetch` is built on), connections kept alive: several times faster for small queries.
   */
  fetch?: typeof fetch;
}

/** A resolved connection. */
export interface Connection {
  readonly url: string;
  readonly authorization: string;
  readonly send: Send;
}

function environment(name: string): string | undefined {
  const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env;
  const value = env?.[name];
  return value === undefined || value === "" ? undefined : value;
}

/** Fills in a connection's defaults, or throws a TypeError naming what is missing. */
export function connect(options: KuraConnection): Connection {
  // The banner's `CLOUDFLARE_API_BASE_URL` (`…/client/v4`, what wrangler reads) names the same
  // server: its origin is the URL.
  const base = environment("CLOUDFLARE_API_BASE_URL")?.replace(/\/+$/, "").replace(/\/client\/v4$/, "");
  const url = (options.url ?? environment("KURA_URL") ?? base ?? "http://127.0.0.1:8780").replace(/\/+$/, "");
  const token = options.token ?? environment("KURA_API_TOKEN") ?? environment("CLOUDFLARE_API_TOKEN");
  if (token === undefined) {
    throw new TypeError("kura-bindings: no API token: pass `token`, or set KURA_API_TOKEN or CLOUDFLARE_API_TOKEN");
  }
  if (options.fetch !== undefined && typeof options.fetch !== "function") {
    throw new TypeError("kura-bindings: `fetch` must be a function");
  }
  const send = options.fetch === undefined ? sendWithUndici : sendWithFetch(options.fetch);
  return { url, authorization: `Bearer ${token}`, send };
}

/** Bytes as lowercase hex. */
export function toHex(bytes: Uint8Array): string {
  let out = "";
  for (const byte of bytes) out += byte.toString(16).padStart(2, "0");
  return out;
}

/** Lowercase or uppercase hex as bytes, or undefined if it is not hex. */
export function fromHex(text: string): Uint8Array | undefined {
  if (text.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(text)) return undefined;
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** The bytes an ArrayBuffer or view holds (a view's own window of its buffer). */
export function bytesOf(value: ArrayBuffer | ArrayBufferView): Uint8Array {
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
}
