// kura's tail worker (generated configuration, not user code): sends a Worker's events to kura,
// for `kura workers logs` and live tails (`wrangler tail`). While nobody tails the Worker, only
// the events its log keeps are sent (console output, exceptions, failures, Cron Trigger runs),
// plus, at most once a second, a quiet one — kura's answer to each tells whether a tail is
// listening now, and then every event is sent. Events are gathered for a few milliseconds and
// sent together: one request to kura per batch, not per invocation.
let tailing = false;
let askedAt = 0;
let batch = [];
// When the batch being gathered started (0: none is).
let gathering = 0;

const GATHER_MS = 10;

const noteworthy = (e) =>
  e.logs.length > 0 || e.exceptions.length > 0 || e.outcome !== "ok" || e.event?.cron !== undefined;

async function flush(env) {
  await new Promise((resolve) => setTimeout(resolve, GATHER_MS));
  const sent = batch;
  batch = [];
  gathering = 0;
  const answer = await env.SINK.fetch("http://kura/logs", { method: "POST", body: `[${sent.join(",")}]` });
  tailing = answer.headers.get("x-kura-tailing") === "1";
}

export default {
  async tail(events, env) {
    const now = Date.now();
    let chosen = tailing ? events : events.filter(noteworthy);
    if (chosen.length === 0 && now - askedAt >= 1000) {
      chosen = events;
    }
    if (chosen.length === 0) {
      return;
    }
    askedAt = now;
    // Serialised here: an invocation's trace objects are its own, and the batch may be sent
    // from another invocation.
    for (const event of chosen) {
      batch.push(JSON.stringify(event));
    }
    // The first invocation of a batch sends it, once the others have had a moment to join
    // (a gatherer that never finished — its invocation cut short — is replaced after a second).
    if (gathering === 0 || now - gathering > 1000) {
      gathering = now;
      await flush(env);
    }
  },
};
