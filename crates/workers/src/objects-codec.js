// kura's wire for calls to Durable Objects in a cluster (generated configuration, not user
// code), shared by the stub binding and the door: the headers a call and its answer carry, and
// the values JavaScript RPC takes that structured clone can copy, written as JSON with a tag
// for each kind JSON cannot say. What cannot cross nodes this way — stubs, functions, streams,
// requests, values that refer to themselves — is refused, naming it.

const OBJECT = "x-kura-do-object";
const NAME = "x-kura-do-name";
const KIND = "x-kura-do-kind";
const REQUEST = "x-kura-do-request";
const BODY = "x-kura-do-body";
const CLASS = "x-kura-do-class";
const ANSWER = "x-kura-do-answer";

const TYPED = {
  Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array,
  Float32Array, Float64Array, BigInt64Array, BigUint64Array, DataView,
};
const ERRORS = { Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError };

function toBase64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function fromBase64(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function refuse(what) {
  return new TypeError(
    `${what} cannot be sent to or from a Durable Object on another kura node: kura forwards structured-clonable values only (no stubs, functions, streams, requests or responses)`,
  );
}

function describe(value) {
  if (typeof value === "function") return "A function (or an RPC stub)";
  const name = Object.getPrototypeOf(value)?.constructor?.name;
  return name ? `A value of type ${name}` : "This value";
}

function pack(value, path) {
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      if (Number.isFinite(value) && !Object.is(value, -0)) return value;
      return ["n", String(Object.is(value, -0) ? "-0" : value)];
    case "undefined":
      return ["u"];
    case "bigint":
      return ["b", value.toString()];
    case "object":
      break;
    default:
      throw refuse(describe(value));
  }
  if (value === null) return null;
  if (path.has(value)) throw refuse("A value that refers to itself");
  path.add(value);
  try {
    const proto = Object.getPrototypeOf(value);
    if (Array.isArray(value)) return ["a", Array.from(value, (item) => pack(item, path))];
    if (proto === Object.prototype || proto === null) {
      return ["o", Object.keys(value).map((key) => [key, pack(value[key], path)])];
    }
    if (value instanceof Date) return ["d", pack(value.getTime(), path)];
    if (value instanceof RegExp) return ["r", value.source, value.flags];
    if (value instanceof Map) return ["m", Array.from(value, ([k, v]) => [pack(k, path), pack(v, path)])];
    if (value instanceof Set) return ["s", Array.from(value, (item) => pack(item, path))];
    if (value instanceof ArrayBuffer) return ["ab", toBase64(new Uint8Array(value))];
    if (ArrayBuffer.isView(value)) {
      const kind = Object.keys(TYPED).find((name) => value instanceof TYPED[name]);
      if (kind) {
        const bytes = new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
        return ["t", kind, toBase64(bytes)];
      }
    }
    if (value instanceof Error) {
      return ["e", String(value.name), String(value.message), value.stack === undefined ? null : String(value.stack)];
    }
    if (value instanceof Boolean || value instanceof Number || value instanceof String) {
      return ["p", pack(value.valueOf(), path)];
    }
    throw refuse(describe(value));
  } finally {
    path.delete(value);
  }
}

function unpack(packed) {
  if (!Array.isArray(packed)) return packed;
  switch (packed[0]) {
    case "n":
      return Number(packed[1]);
    case "u":
      return undefined;
    case "b":
      return BigInt(packed[1]);
    case "a":
      return packed[1].map(unpack);
    case "o": {
      const out = {};
      for (const [key, item] of packed[1]) {
        Object.defineProperty(out, key, { value: unpack(item), writable: true, enumerable: true, configurable: true });
      }
      return out;
    }
    case "d":
      return new Date(unpack(packed[1]));
    case "r":
      return new RegExp(packed[1], packed[2]);
    case "m":
      return new Map(packed[1].map(([k, v]) => [unpack(k), unpack(v)]));
    case "s":
      return new Set(packed[1].map(unpack));
    case "ab":
      return fromBase64(packed[1]).buffer;
    case "t": {
      const bytes = fromBase64(packed[2]);
      const Kind = TYPED[packed[1]];
      if (Kind === DataView) return new DataView(bytes.buffer);
      return new Kind(bytes.buffer, 0, bytes.byteLength / Kind.BYTES_PER_ELEMENT);
    }
    case "e": {
      const Kind = Object.hasOwn(ERRORS, packed[1]) ? ERRORS[packed[1]] : Error;
      const error = new Kind(packed[2]);
      if (error.name !== packed[1]) error.name = packed[1];
      if (packed[3] !== null) error.stack = packed[3];
      return error;
    }
    case "p":
      return Object(unpack(packed[1]));
    default:
      throw new Error(`kura could not read a value sent between nodes (tag ${packed[0]})`);
  }
}

/** The text a value travels as. */
function encode(value) {
  return JSON.stringify(pack(value, new Set()));
}

/** The value a text says. */
function decode(text) {
  return unpack(JSON.parse(text));
}
