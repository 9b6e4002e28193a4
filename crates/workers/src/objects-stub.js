
// kura's Durable Object namespace binding on a cluster's node (generated configuration, not
// user code). A namespace's objects run on the one node that serves it, so a stub here sends
// its `fetch()` and its RPC calls to kura, which runs them on that node (this one or another)
// and answers once what they wrote is in the cluster's store. Ids are workerd's own (the same
// unique key on every node makes the same ids).

const OBJECT = "x-kura-do-object";
const NAME = "x-kura-do-name";
const KIND = "x-kura-do-kind";
const REQUEST = "x-kura-do-request";
const ANSWER = "x-kura-do-answer";

async function answered(response) {
  if (response.headers.get(ANSWER) === "value") {
    const [outcome, value] = decode(await response.text());
    if (outcome === "threw") throw value;
    return value;
  }
  throw new Error(`The Durable Object could not be reached: ${(await response.text()).trim()}`);
}

function sendTo(kura, id) {
  const headers = { [OBJECT]: id.toString() };
  if (id.name !== undefined) headers[NAME] = encodeURIComponent(id.name);
  return (kind, init) => kura.fetch("http://kura/objects/call", { method: "POST", ...init, headers: { ...headers, [KIND]: kind, ...init.headers } });
}

function stub(kura, id) {
  const send = sendTo(kura, id);
  const own = {
    id,
    name: id.name,
    async fetch(input, init) {
      const request = new Request(input, init);
      const head = { method: request.method, url: request.url, headers: [...request.headers] };
      const response = await send("fetch", {
        headers: { [REQUEST]: encodeURIComponent(JSON.stringify(head)) },
        body: request.body,
      });
      if (response.headers.get(ANSWER) !== "fetch") return answered(response);
      const headers = new Headers(response.headers);
      headers.delete(ANSWER);
      return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
    },
    connect() {
      throw new Error("connect() on a Durable Object stub is not served by a kura cluster");
    },
  };
  return new Proxy(own, {
    get(target, property) {
      if (property in target) return target[property];
      // A stub is not a promise: `await stub` must not call it.
      if (typeof property !== "string" || property === "then") return undefined;
      return (...args) => {
        let body;
        try {
          body = encode([property, args]);
        } catch (e) {
          return Promise.reject(e);
        }
        return send("call", { body }).then(answered);
      };
    },
  });
}

class DurableObjectNamespace {
  #inner;
  #kura;

  constructor(inner, kura) {
    this.#inner = inner;
    this.#kura = kura;
  }

  idFromName(name) {
    return this.#inner.idFromName(name);
  }

  idFromString(id) {
    return this.#inner.idFromString(id);
  }

  newUniqueId(options) {
    return this.#inner.newUniqueId(options);
  }

  jurisdiction(name) {
    return new DurableObjectNamespace(this.#inner.jurisdiction(name), this.#kura);
  }

  get(id, _options) {
    // workerd's own check that the id is this namespace's, with its own error.
    this.#inner.idFromString(id.toString());
    return stub(this.#kura, id);
  }

  getByName(name, options) {
    return this.get(this.idFromName(name), options);
  }
}

export default function (env) {
  return new DurableObjectNamespace(env.namespace, env.kura);
}
