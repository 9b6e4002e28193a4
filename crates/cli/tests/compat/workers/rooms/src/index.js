// Chat rooms: each room is a Durable Object with its own SQLite storage, reached by name
// (`room:<name>`); D1 keeps a directory of who joined which room, so a query across rooms can
// be answered from D1 or by asking every room.
import { DurableObject } from "cloudflare:workers";

export class Room extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.blockConcurrencyWhile(async () => {
      this.ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY, joined_at INTEGER NOT NULL)");
    });
  }

  add(name) {
    this.ctx.storage.sql.exec("INSERT OR IGNORE INTO members (name, joined_at) VALUES (?, ?)", name, Date.now());
    return this.members();
  }

  members() {
    return this.ctx.storage.sql.exec("SELECT name FROM members ORDER BY name").toArray().map((row) => row.name);
  }
}

const json = (value, status = 200) => Response.json(value, { status });
const room = (env, name) => env.ROOMS.getByName(`room:${name}`);

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const parts = url.pathname.split("/").filter(Boolean);
    if (url.pathname === "/setup") {
      await env.DB.exec("CREATE TABLE IF NOT EXISTS memberships (room TEXT NOT NULL, name TEXT NOT NULL, PRIMARY KEY (room, name))");
      return json({ ok: true });
    }
    if (parts[0] === "rooms" && parts[2] === "join") {
      const name = url.searchParams.get("name");
      const members = await room(env, parts[1]).add(name);
      await env.DB.prepare("INSERT OR IGNORE INTO memberships (room, name) VALUES (?, ?)").bind(parts[1], name).run();
      return json(members);
    }
    if (parts[0] === "rooms" && parts.length === 2) return json(await room(env, parts[1]).members());
    if (url.pathname === "/unique") {
      const id = env.ROOMS.newUniqueId();
      return json({ id: id.toString(), members: await env.ROOMS.get(id).members() });
    }
    if (url.pathname === "/directory") {
      const only = url.searchParams.get("room");
      const query = only
        ? env.DB.prepare("SELECT room, name FROM memberships WHERE room = ? ORDER BY room, name").bind(only)
        : env.DB.prepare("SELECT room, name FROM memberships ORDER BY room, name");
      return json((await query.all()).results);
    }
    if (url.pathname === "/collect") {
      const only = url.searchParams.get("room");
      const rooms = only ? [only] : (await env.DB.prepare("SELECT DISTINCT room FROM memberships ORDER BY room").all()).results.map((r) => r.room);
      const rows = [];
      for (const name of rooms) for (const member of await room(env, name).members()) rows.push({ room: name, name: member });
      return json(rows);
    }
    return new Response("not found", { status: 404 });
  },
};
