// kura's tail worker (generated configuration, not user code): sends a Worker's events to kura,
// for `kura workers logs` and live tails (`wrangler tail`). While nobody tails the Worker, only
// the events its log keeps are sent (console output, exceptions, failures, Cron Trigger runs),
// plus, at most once a second, a quiet one — kura's answer to each tells whether a tail is
// listening now, and then every event is sent.
let tailing = false;
let askedAt = 0;

const noteworthy = (e) =>
  e.logs.length > 0 || e.exceptions.length > 0 || e.outcome !== "ok" || e.event?.cron !== undefined;

export default {
  async tail(events, env) {
    const now = Date.now();
    let sent = tailing ? events : events.filter(noteworthy);
    if (sent.length === 0 && now - askedAt >= 1000) {
      sent = events;
    }
    if (sent.length > 0) {
      askedAt = now;
      const answer = await env.SINK.fetch("http://kura/logs", { method: "POST", body: JSON.stringify(sent) });
      tailing = answer.headers.get("x-kura-tailing") === "1";
    }
  },
};
