// kura's tail worker (generated configuration, not user code): sends a Worker's console output,
// uncaught exceptions and failed invocations to kura, for `kura workers logs`. Invocations that
// logged nothing and succeeded are not sent.
export default {
  async tail(events, env) {
    const kept = events.filter((e) => e.logs.length > 0 || e.exceptions.length > 0 || e.outcome !== "ok");
    if (kept.length > 0) {
      await env.SINK.fetch("http://kura/logs", { method: "POST", body: JSON.stringify(kept) });
    }
  },
};
