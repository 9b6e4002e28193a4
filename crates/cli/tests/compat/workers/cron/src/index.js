const SCHEMA = "CREATE TABLE IF NOT EXISTS runs (cron TEXT NOT NULL, scheduled INTEGER NOT NULL, no_retry TEXT NOT NULL)";

export default {
  async fetch(request, env) {
    const say = new URL(request.url).searchParams.get("say");
    if (say !== null) {
      console.log("said", say);
    }
    await env.DB.exec(SCHEMA);
    const { results } = await env.DB.prepare("SELECT cron, scheduled, no_retry FROM runs ORDER BY rowid").all();
    return Response.json(results);
  },

  async scheduled(controller, env, ctx) {
    console.log(`running ${controller.cron} for ${controller.scheduledTime}`);
    if (controller.cron === "fail") {
      throw new Error("the job failed");
    }
    await env.DB.exec(SCHEMA);
    ctx.waitUntil(
      env.DB.prepare("INSERT INTO runs (cron, scheduled, no_retry) VALUES (?, ?, ?)")
        .bind(controller.cron, controller.scheduledTime, typeof controller.noRetry)
        .run(),
    );
  },
};
