
// kura's Durable Object namespace binding on a cluster's node (generated configuration, not
// user code). A namespace's objects run on the one node that serves it, so a stub here sends
// its `fetch()` and its RPC calls to kura, which runs them on that node (this one or another)
// and answers once what they wrote is in the cluster's store. Ids are workerd's own (the same
// unique key on every node makes the same ids).

// kura's own refusal, worded by what it promises: a 503 that nothing happened (retry), a 4xx
// that the call was wrong, anything else that its outcome is unknown.
async function refused(response) {
  const said = (await response.text()).trim();
  if (response.status === 503) {
    const error = new Error(`The Durable Object is unavailable for now: ${said}`);
    error.retryable = true;
    return error;
  }
  if (response.status >= 400 && response.status < 500) return new Error(`The Durable Object could not be called: ${said}`);
  return new Error(`The Durable Object call failed, and may or may not have taken effect: ${said}`);
}

async function answered(response) {
  if (response.headers.get(ANSWER) === "value") {
    const [outcome, value] = decode(await response.text());
    if (outcome === "threw") throw value;
    return value;
  }
  throw await refused(response);
}

function sendTo(kura, id) {
  const headers = { [OBJECT]: id.toString() };
  if (id.name !== undefined) headers[NAME] = encodeURIComponent(id.name);
  return (kind, init) => kura.fetch("http://kura/objects/call", { method: "POST", ...init, headers: { ...headers, [KIND]: kind, ...init.headers } });
}

function stub(kura, id) {
  const send = sendTo(kura, id);
  const own = Object.assign(Object.create(null), {
    id,
    name: id.name,
    async fetch(input, init) {
      const request = new Request(input, init);
      if (request.headers.get("upgrade")?.toLowerCase() === "websocket") {
        throw new TypeError("A WebSocket to a Durable Object is not served across a kura cluster's nodes yet");
      }
      const head = { method: request.method, url: request.url, headers: [...request.headers] };
      const headers = { [REQUEST]: encodeURIComponent(JSON.stringify(head)) };
      if (request.body !== null) headers[BODY] = "1";
      const response = await send("fetch", { headers, body: request.body });
      if (response.headers.get(ANSWER) !== "fetch") return answered(response);
      const answer = new Headers(response.headers);
      answer.delete(ANSWER);
      return new Response(response.body, { status: response.status, statusText: response.statusText, headers: answer });
    },
    connect() {
      throw new Error("connect() on a Durable Object stub is not served by a kura cluster");
    },
  });
  own[Symbol.dispose] = () => {};
  return new Proxy(own, {
    get(target, property) {
      if (Object.hasOwn(target, property)) return target[property];
      // A stub is not a promise (`await stub` must not call it), nor JSON.
      if (typeof property !== "string" || property === "then" || property === "toJSON") return undefined;
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
