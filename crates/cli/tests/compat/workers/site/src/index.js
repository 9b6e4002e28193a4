export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/api/asset") {
      // The Worker reads one of its own files.
      const file = await env.ASSETS.fetch(new URL("/app.js", request.url));
      return new Response(`asset ${file.status}: ${await file.text()}`);
    }
    if (url.pathname.startsWith("/api/")) {
      return Response.json({ api: url.pathname });
    }
    return new Response(`worker: ${url.pathname}`, { status: 404 });
  },
};
