
// kura's door to the Durable Objects a script's classes run on this node (generated
// configuration, not user code): kura sends it the calls stubs made on any node once this
// node serves the namespace, and it makes them on the object with workerd's own stub.

function value(outcome, result) {
  let body;
  try {
    body = encode([outcome, result]);
  } catch (e) {
    body = encode(["threw", e]);
  }
  return new Response(body, { headers: { [ANSWER]: "value" } });
}

export default {
  async fetch(request, env) {
    const namespace = env[request.headers.get(CLASS)];
    if (!namespace) return new Response(`no Durable Object class '${request.headers.get(CLASS)}' here`, { status: 500 });
    const name = request.headers.get(NAME);
    const id = name === null ? namespace.idFromString(request.headers.get(OBJECT)) : namespace.idFromName(decodeURIComponent(name));
    const object = namespace.get(id);
    try {
      if (request.headers.get(KIND) === "fetch") {
        const head = JSON.parse(decodeURIComponent(request.headers.get(REQUEST)));
        const body = request.headers.get(BODY) === "1" ? request.body : null;
        const response = await object.fetch(new Request(head.url, { method: head.method, headers: head.headers, body }));
        const answer = new Response(response.body, response);
        answer.headers.set(ANSWER, "fetch");
        return answer;
      }
      const [method, args] = decode(await request.text());
      return value("returned", await object[method](...args));
    } catch (e) {
      return value("threw", e);
    }
  },
};
