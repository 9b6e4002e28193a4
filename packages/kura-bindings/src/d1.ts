// Cloudflare's D1Database for Node.js: the interface a Worker's `env.DB` has, speaking D1's
// binding protocol (what workerd's D1 shim sends) to kura's `/binding/d1/{database}` routes.
// Method by method it does what workerd's shim does: the same requests, the same result
// shapes and the same error texts, so code and ORMs written for `env.DB` run unchanged.

import { connect, type Connection, type KuraConnection } from "./connection.js";
import type { Reply } from "./http.js";

/** D1's per-query figures, as a Worker's `env.DB` reports them. */
export interface D1Meta {
  duration: number;
  size_after: number;
  rows_read: number;
  rows_written: number;
  last_row_id: number;
  changed_db: boolean;
  changes: number;
  served_by_region?: string;
  served_by_colo?: string;
  served_by_primary?: boolean;
  timings?: { sql_duration_ms: number };
  total_attempts?: number;
}

export interface D1Response {
  success: true;
  meta: D1Meta & Record<string, unknown>;
  error?: never;
}

export type D1Result<T = unknown> = D1Response & { results: T[] };

export interface D1ExecResult {
  count: number;
  duration: number;
}

export type D1SessionConstraint = "first-primary" | "first-unconstrained";
export type D1SessionBookmark = string;

/** Where a D1 database is: a kura server and the database's id or name. */
export interface D1Options extends KuraConnection {
  /** The database's id (UUID) or name. */
  database: string;
}

/** D1's session header: a constraint or bookmark in, the database's bookmark out. */
const SESSION_HEADER = "x-cf-d1-session-commit-token";

type Format = "ROWS_AND_COLUMNS" | "NONE";
type Params = (number | string | null | number[])[];
interface WireStatement {
  sql: string;
  params?: Params;
}
interface WireRows {
  columns: string[];
  rows: unknown[][];
}
interface WireResult {
  success?: boolean;
  error?: string;
  meta?: D1Meta & Record<string, unknown>;
  results?: WireRows | Record<string, unknown>[];
}

/** Sends statements to one database. */
class Transport {
  readonly #connection: Connection;
  readonly #base: string;

  constructor(connection: Connection, database: string) {
    this.#connection = connection;
    this.#base = `${connection.url}/binding/d1/${encodeURIComponent(database)}`;
  }

  /** The per-statement results, or the upstream error text; and the bookmark answered. */
  async send(
    endpoint: "query" | "execute",
    body: WireStatement | WireStatement[],
    format: Format,
    session: string | null,
  ): Promise<{ results: WireResult[]; bookmark: string | null }> {
    const headers: Record<string, string> = {
      authorization: this.#connection.authorization,
      "content-type": "application/json",
    };
    if (session !== null) headers[SESSION_HEADER] = session;
    let reply: Reply;
    let text: string;
    try {
      const url = `${this.#base}/${endpoint}?resultsFormat=${format}`;
      reply = await this.#connection.send("POST", url, headers, JSON.stringify(body));
      text = await reply.text();
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      throw new Error(`D1_ERROR: ${message}`, { cause: e });
    }
    let parsed: WireResult | WireResult[];
    try {
      parsed = JSON.parse(text) as WireResult | WireResult[];
    } catch (e) {
      throw new Error(`D1_ERROR: Failed to parse body as JSON, got: ${text}`, { cause: e });
    }
    const results = Array.isArray(parsed) ? parsed : [parsed];
    return { results, bookmark: reply.header(SESSION_HEADER) };
  }
}

/** The first upstream error in `results`, thrown as D1 throws it. */
function throwIfFailed(results: WireResult[]): void {
  const failed = results[0];
  if (failed === undefined || failed.error !== undefined || failed.success === false) {
    const error = failed?.error ?? "Something went wrong";
    throw new Error(`D1_ERROR: ${error}`, { cause: new Error(error) });
  }
}

/** Rows as objects; a column named twice keeps its last value, as in a Worker. */
function toObjects<T>(results: WireResult["results"]): T[] {
  if (results === undefined) return [];
  if (Array.isArray(results)) return results as T[];
  const { columns, rows } = results;
  return rows.map((row) => {
    const object: Record<string, unknown> = {};
    columns.forEach((column, i) => {
      object[column] = row[i];
    });
    return object as T;
  });
}

function toResult<T>(result: WireResult): D1Result<T> {
  return {
    success: true,
    meta: result.meta ?? ({} as D1Meta & Record<string, unknown>),
    results: toObjects<T>(result.results),
  };
}

/** A bound value as D1's binding sends it, or the D1_TYPE_ERROR a Worker gets for it. */
function toParam(value: unknown): number | string | null | number[] {
  switch (typeof value) {
    case "number":
    case "string":
      return value;
    case "boolean":
      return value ? 1 : 0;
  }
  if (value === null) return null;
  if (Array.isArray(value) && value.every((b) => typeof b === "number" && b >= 0 && b < 256)) {
    return value as number[];
  }
  if (value instanceof ArrayBuffer) return Array.from(new Uint8Array(value));
  if (ArrayBuffer.isView(value)) return Array.from(value as unknown as ArrayLike<number>);
  const described = `Type '${typeof value}' not supported for value '${String(value)}'`;
  throw new Error(`D1_TYPE_ERROR: ${described}`, { cause: new Error(described) });
}

/** A session's requests: the plain database's (always the primary, no bookmarks) or one that
 *  sends its constraint or bookmark and keeps the latest bookmark answered. */
class Session {
  readonly transport: Transport;
  #bookmark: string | null;
  readonly #tracks: boolean;

  constructor(transport: Transport, constraintOrBookmark: string | null) {
    this.transport = transport;
    this.#bookmark = constraintOrBookmark;
    this.#tracks = constraintOrBookmark !== null;
  }

  async send(
    endpoint: "query" | "execute",
    body: WireStatement | WireStatement[],
    format: Format,
  ): Promise<WireResult[]> {
    const { results, bookmark } = await this.transport.send(endpoint, body, format, this.#bookmark);
    if (this.#tracks && bookmark !== null) {
      if (this.#bookmark === null || isConstraint(this.#bookmark) || this.#bookmark.localeCompare(bookmark) < 0) {
        this.#bookmark = bookmark;
      }
    }
    return results;
  }

  bookmark(): string | null {
    return this.#bookmark === null || isConstraint(this.#bookmark) ? null : this.#bookmark;
  }

  async batch<T>(statements: D1PreparedStatement[]): Promise<D1Result<T>[]> {
    const body = statements.map((s) => s.wire());
    const results = await this.send("query", body, "ROWS_AND_COLUMNS");
    throwIfFailed(results);
    return results.map((r) => toResult<T>(r));
  }
}

function isConstraint(value: string): boolean {
  return value === "first-primary" || value === "first-unconstrained";
}

/** One SQL statement and its bound values; `bind()` makes a new one. */
export class D1PreparedStatement {
  readonly #session: Session;
  readonly statement: string;
  readonly params: unknown[];

  /** @internal */
  constructor(session: Session, statement: string, params: unknown[] = []) {
    this.#session = session;
    this.statement = statement;
    this.params = params;
  }

  bind(...values: unknown[]): D1PreparedStatement {
    return new D1PreparedStatement(this.#session, this.statement, values.map(toParam));
  }

  /** @internal What the binding protocol sends for this statement. */
  wire(): WireStatement {
    return { sql: this.statement, params: this.params as Params };
  }

  /** @internal The statement's run, once; its result failed or not. */
  async #one(endpoint: "query" | "execute", format: Format): Promise<WireResult> {
    const results = await this.#session.send(endpoint, this.wire(), format);
    throwIfFailed(results);
    return results[0] as WireResult;
  }

  first<T = unknown>(colName: string): Promise<T | null>;
  first<T = Record<string, unknown>>(): Promise<T | null>;
  async first<T>(colName?: string): Promise<T | null> {
    const rows = toObjects<Record<string, unknown>>((await this.#one("query", "ROWS_AND_COLUMNS")).results);
    const row = rows[0];
    if (row === undefined) return null;
    if (colName === undefined) return row as T;
    if (row[colName] === undefined) {
      throw new Error(`D1_COLUMN_NOTFOUND: Column not found (${colName})`, {
        cause: new Error("Column not found"),
      });
    }
    return row[colName] as T;
  }

  async run<T = Record<string, unknown>>(): Promise<D1Result<T>> {
    return toResult<T>(await this.#one("execute", "NONE"));
  }

  async all<T = Record<string, unknown>>(): Promise<D1Result<T>> {
    return toResult<T>(await this.#one("query", "ROWS_AND_COLUMNS"));
  }

  raw<T = unknown[]>(options: { columnNames: true }): Promise<[string[], ...T[]]>;
  raw<T = unknown[]>(options?: { columnNames?: false }): Promise<T[]>;
  async raw<T = unknown[]>(options?: { columnNames?: boolean }): Promise<T[] | [string[], ...T[]]> {
    const results = (await this.#one("query", "ROWS_AND_COLUMNS")).results;
    let columns: string[];
    let rows: unknown[][];
    if (results === undefined) {
      [columns, rows] = [[], []];
    } else if (Array.isArray(results)) {
      // An answer in objects (older servers): their keys are the columns.
      columns = results[0] === undefined ? [] : Object.keys(results[0]);
      rows = results.map((r) => Object.values(r));
    } else {
      ({ columns, rows } = results);
    }
    if (options?.columnNames === true) return [columns, ...(rows as T[])];
    return rows as T[];
  }
}

/** A session: its statements see at least what its bookmark saw. */
export class D1DatabaseSession {
  readonly #session: Session;

  /** @internal */
  constructor(session: Session) {
    this.#session = session;
  }

  prepare(query: string): D1PreparedStatement {
    return new D1PreparedStatement(this.#session, query);
  }

  batch<T = unknown>(statements: D1PreparedStatement[]): Promise<D1Result<T>[]> {
    return this.#session.batch<T>(statements);
  }

  /** The latest bookmark this session's queries answered, or null before the first. */
  getBookmark(): D1SessionBookmark | null {
    return this.#session.bookmark();
  }
}

/** A D1 database on a kura server, with the methods of a Worker's `env.DB`. */
export class D1Database {
  readonly #transport: Transport;
  readonly #primary: Session;

  /** @internal */
  constructor(transport: Transport) {
    this.#transport = transport;
    this.#primary = new Session(transport, null);
  }

  prepare(query: string): D1PreparedStatement {
    return new D1PreparedStatement(this.#primary, query);
  }

  batch<T = unknown>(statements: D1PreparedStatement[]): Promise<D1Result<T>[]> {
    return this.#primary.batch<T>(statements);
  }

  /** Runs each line of `query` as a statement, in one transaction, as D1's `exec` does. */
  async exec(query: string): Promise<D1ExecResult> {
    const lines = query.trim().split("\n");
    const results = await this.#primary.send(
      "execute",
      lines.map((sql) => ({ sql })),
      "NONE",
    );
    const failed = results.findIndex((r) => r.error !== undefined || r.success === false);
    if (failed !== -1) {
      const error = results[failed]?.error ?? "Something went wrong";
      throw new Error(`D1_EXEC_ERROR: Error in line ${failed + 1}: ${lines[failed]}: ${error}`, {
        cause: new Error(error),
      });
    }
    return {
      count: results.length,
      duration: results.reduce((sum, r) => sum + (r.meta?.duration ?? 0), 0),
    };
  }

  /** A session starting at a constraint (default `first-unconstrained`) or a bookmark. */
  withSession(constraintOrBookmark?: D1SessionBookmark | D1SessionConstraint): D1DatabaseSession {
    const start = constraintOrBookmark?.trim() || "first-unconstrained";
    return new D1DatabaseSession(new Session(this.#transport, start));
  }

  /** @deprecated As on D1, only alpha databases could be dumped: use D1's export instead. */
  async dump(): Promise<ArrayBuffer> {
    throw new Error(
      "D1_DUMP_ERROR: dump() was only for D1's alpha databases; export with `wrangler d1 export` or the v4 export API",
    );
  }
}

/** The D1 database `options.database` on the kura server `options.url`, as a `D1Database`. */
export function d1(options: D1Options): D1Database {
  if (typeof options?.database !== "string" || options.database === "") {
    throw new TypeError("kura-bindings: d1() needs `database`, a database's id or name");
  }
  return new D1Database(new Transport(connect(options), options.database));
}
