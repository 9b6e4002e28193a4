// kura's cron trigger (generated configuration, not user code): kura asks it to run a Worker's
// `scheduled` handler, through a service binding and workerd's `Fetcher.scheduled()`.
export default {
  async fetch(request, env) {
    const { cron, scheduledTime } = await request.json();
    const result = await env.TARGET.scheduled({ cron, scheduledTime: new Date(scheduledTime) });
    return Response.json({ outcome: result.outcome, noRetry: result.noRetry });
  },
};
