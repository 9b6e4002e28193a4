// kura's tail worker (generated configuration, not user code): sends a Worker's console output,
// uncaught exceptions, failed invocations and every Cron Trigger run to kura, for `kura workers
// logs`. Requests that logged nothing and succeeded are not sent.
export default {
  async tail(events, env) {
    const kept = events.filter(
      (e) => e.logs.length > 0 || e.exceptions.length > 0 || e.outcome !== "ok" || e.event?.cron !== undefined,
    );
    if (kept.length > 0) {
      await env.SINK.fetch("http://kura/logs", { method: "POST", body: JSON.stringify(kept) });
    }
  },
};
