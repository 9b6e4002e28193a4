// The web console in headless Chromium (Debian's), driven by puppeteer-core against a real
// kura server: sign in, D1 (create, SQL, a 10,000-row table paged, Time Travel restore and undo,
// import), R2 (a 20 MiB multipart upload downloaded byte-identical, details, a presigned URL
// fetched from outside), KV (a namespace made, 150 keys paged by prefix, a key written with
// metadata and expiry, read and deleted), Queues (backlog, a message in flight, a message
// sent), Durable Objects (a room's objects by name, SQL, fan-out), Workers (cron
// runs among the recent logs, a request seen live through a tail), tokens (a
// read-only token sees a read-only console), a phone-width screen, and text holding markup
// shown as text. Every page is screenshotted into SCREENSHOTS; the run fails on any console
// error, any failed request and any error answer the test did not provoke.
//
//   KURA_URL KURA_WORKERS_URL KURA_API_TOKEN KURA_ACCOUNT_ID CHROMIUM SCREENSHOTS PUPPETEER (its directory)

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

const { KURA_URL, KURA_WORKERS_URL, KURA_API_TOKEN, KURA_ACCOUNT_ID, CHROMIUM, SCREENSHOTS, PUPPETEER } = process.env;
const puppeteer = createRequire(join(PUPPETEER, "package.json"))("puppeteer-core");
const CONSOLE = `${KURA_URL}/console/`;
const work = mkdtempSync(join(tmpdir(), "kura-console-"));
const downloads = join(work, "downloads");
mkdirSync(downloads);
mkdirSync(SCREENSHOTS, { recursive: true });

let checks = 0;
function check(condition, message) {
  assert.ok(condition, message);
  checks++;
}

const api = async (method, path, body, token = KURA_API_TOKEN) => {
  const response = await fetch(`${KURA_URL}/client/v4/accounts/${KURA_ACCOUNT_ID}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await response.json();
  assert.ok(json.success, `${method} ${path}: ${JSON.stringify(json.errors)}`);
  return json.result;
};

// Fixtures made through the API: a namespace of chat rooms with objects by name, an object
// whose key and metadata hold markup.
await api("POST", "/workers/durable_objects/namespaces", { name: "rooms" });
for (const room of ["lobby", "kitchen"]) {
  await api("POST", `/workers/durable_objects/namespaces/rooms/objects/${room}/query`, [
    { sql: "CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)" },
    { sql: "INSERT INTO messages (body) VALUES (?)", params: [`hello from the ${room}`] },
  ]);
}

const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});

/** Problems the console showed: console errors, page errors, failed requests, error answers. */
const problems = [];
/** Error answers the test provokes on purpose (a SQL error): `${status} ${path}` prefixes. */
const expected = new Set();

async function newPage(width = 1280, height = 900) {
  const page = await browser.newPage();
  await page.setViewport({ width, height });
  page.on("console", (m) => {
    // A failed load is also an error answer, which is checked below (some are provoked).
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console error: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    if (r.status() >= 400) {
      const path = new URL(r.url()).pathname;
      if (![...expected].some((e) => `${r.status()} ${path}`.startsWith(e))) problems.push(`error answer: ${r.status()} ${r.request().method()} ${path}`);
    }
  });
  page.on("dialog", (d) => d.accept());
  const cdp = await page.createCDPSession();
  await cdp.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: downloads });
  return page;
}

async function shot(page, name) {
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

/** Waits for an element holding `text` (as text, never as markup). */
async function waitText(page, selector, text, timeout = 15_000) {
  await page.waitForFunction(
    (s, t) => [...document.querySelectorAll(s)].some((el) => el.textContent.includes(t)),
    { timeout },
    selector,
    text,
  );
}

async function clickText(page, selector, text) {
  await waitText(page, selector, text);
  await page.evaluate(
    (s, t) => [...document.querySelectorAll(s)].find((el) => el.textContent.includes(t)).click(),
    selector,
    text,
  );
}

async function go(page, hash) {
  // The same hash again draws the page again, as following its link does.
  await page.evaluate((h) => (location.hash === h ? window.dispatchEvent(new HashChangeEvent("hashchange")) : (location.hash = h)), hash);
  await page.waitForFunction(() => !document.querySelector("main [aria-busy]"), { timeout: 15_000 });
}

async function signIn(page, token) {
  await page.goto(CONSOLE, { waitUntil: "networkidle0" });
  await page.waitForSelector("input[name=token]");
  // By keyboard: the field has focus, Enter submits.
  await page.keyboard.type(token);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#nav a");
}

async function runSql(page, sql) {
  await page.waitForSelector("textarea[name=sql]");
  await page.$eval("textarea[name=sql]", (el, v) => (el.value = v), sql);
  await page.click("form[aria-label='Run SQL'] button[type=submit]");
  await page.waitForFunction(() => {
    const out = document.querySelector(".results");
    return out && !out.textContent.includes("Running…") && out.childElementCount > 0;
  });
}

const d1Count = async (uuid) => (await api("POST", `/d1/database/${uuid}/query`, { sql: "SELECT count(*) AS n FROM items" }))[0].results[0].n;

const page = await newPage();
let current = page;
try {
const firstLoad = [];
page.on("response", async (r) => {
  if (new URL(r.url()).pathname.startsWith("/console/")) firstLoad.push(Number(r.headers()["content-length"] ?? (await r.buffer()).length));
});
await page.goto(CONSOLE, { waitUntil: "networkidle0" });
await shot(page, "01-sign-in");
const firstLoadBytes = firstLoad.reduce((a, b) => a + b, 0);
check(firstLoadBytes < 300 * 1024, `the first load is ${firstLoadBytes} bytes compressed`);
check((await page.$eval("label[for]", (l) => document.getElementById(l.htmlFor) !== null)), "the token field is labelled");

// A wrong token is refused in the API's words.
expected.add("400 /client/v4/user/tokens/verify").add("401 /client/v4/user/tokens/verify").add("403 /client/v4/user/tokens/verify");
await page.type("input[name=token]", "not-a-real-token-0123456789abcdefghijkl");
await page.keyboard.press("Enter");
await page.waitForSelector(".form-status .error");
check(/token/i.test(await page.$eval(".form-status .error", (e) => e.textContent)), "a bad token's error names the token");
expected.clear();

await signIn(page, KURA_API_TOKEN);
check((await page.$$eval("#nav a", (as) => as.map((a) => a.textContent))).includes("API tokens"), "an admin sees the tokens page");

// ---- D1 ----
await go(page, "#/d1");
await page.click("details.panel summary");
await page.type("form[aria-label='Create a database'] input[name=name]", "shop");
await page.click("form[aria-label='Create a database'] button[type=submit]");
await page.waitForFunction(() => document.querySelector("h1")?.textContent === "shop");
const uuid = decodeURIComponent(await page.evaluate(() => location.hash.split("/")[2]));
check(/^[0-9a-f-]{36}$/.test(uuid), `the new database's page names its id (${uuid})`);

await go(page, `#/d1/${uuid}/query`);
await runSql(
  page,
  `CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000) INSERT INTO items SELECT x, 'item ' || x FROM c;
CREATE TABLE "<script>window.__xss = 1</script>" (v TEXT);
INSERT INTO "<script>window.__xss = 1</script>" VALUES ('<img src=x onerror="window.__xss = 2">');
SELECT count(*) AS total FROM items;`,
);
await waitText(page, ".results", "rows written");
check(await page.$eval(".results", (e) => e.textContent.includes("10000")), "the query's result shows the count");
await shot(page, "02-d1-query");

expected.add(`400 /client/v4/accounts/${KURA_ACCOUNT_ID}/d1/database/${uuid}/raw`);
await runSql(page, "SELECT * FROM nope");
await waitText(page, ".results .error", "no such table: nope");
check(true, "a SQL error is shown as D1 words it");
expected.clear();

await go(page, `#/d1/${uuid}`);
await waitText(page, "td", "items");
check(await page.evaluate(() => [...document.querySelectorAll("td")].some((td) => td.textContent === "10000")), "the table list counts 10,000 rows");
check(await page.evaluate(() => [...document.querySelectorAll("td a")].some((a) => a.textContent === "<script>window.__xss = 1</script>")), "a table named with markup is listed as text");
await shot(page, "03-d1-tables");

// The browser pages: 50 rows at a time, never the whole table.
const rowsSeen = [];
page.on("response", async (r) => {
  if (/\/(query|raw)$/.test(r.url()) && r.url().includes(`/d1/database/${uuid}/`) && r.request().method() === "POST") {
    try {
      const json = await r.json();
      for (const result of json.result ?? []) rowsSeen.push(Array.isArray(result.results) ? result.results.length : result.results.rows.length);
    } catch {}
  }
});
await clickText(page, "td a", "items");
await waitText(page, ".page-count", "Page 1 of 200");
await clickText(page, ".pager a", "Next");
await waitText(page, ".page-count", "Page 2 of 200");
check(await page.evaluate(() => [...document.querySelectorAll("td")].some((td) => td.textContent === "item 51")), "page 2 starts at row 51");
check(Math.max(...rowsSeen) <= 50, `no answer carried more than one page of rows (${Math.max(...rowsSeen)})`);
await shot(page, "04-d1-table-browser");

// A table whose name and value hold markup: shown as text.
await go(page, `#/d1/${uuid}/table/${encodeURIComponent("<script>window.__xss = 1</script>")}`);
await waitText(page, "td", '<img src=x onerror="window.__xss = 2">');
check(true, "a value holding markup is shown as text");

// Time Travel: a bookmark, a destructive change, restore, undo.
await go(page, `#/d1/${uuid}/time-travel`);
const before = await page.$eval("code.current", (e) => e.textContent);
await api("POST", `/d1/database/${uuid}/query`, { sql: "DELETE FROM items" });
check((await d1Count(uuid)) === 0, "the rows are gone");
await go(page, `#/d1/${uuid}/query`);
await go(page, `#/d1/${uuid}/time-travel`);
await page.waitForSelector(".chart .bar");
// A bookmark that is not one is refused at preview, before any restore is offered.
expected.add(`400 /client/v4/accounts/${KURA_ACCOUNT_ID}/d1/database/${uuid}/time_travel/history`);
await page.type("form[aria-label='Choose a bookmark'] input[name=bookmark]", "not-a-bookmark");
await page.click("form[aria-label='Choose a bookmark'] button[type=submit]");
await page.waitForSelector(".chosen .error");
check((await page.$(".chosen button")) === null, "a malformed bookmark offers no restore");
expected.clear();
await page.$eval("form[aria-label='Choose a bookmark'] input[name=bookmark]", (el) => (el.value = ""));
await page.type("form[aria-label='Choose a bookmark'] input[name=bookmark]", before);
await page.click("form[aria-label='Choose a bookmark'] button[type=submit]");
await clickText(page, ".chosen button", "Restore to this point");
await page.waitForSelector(".undo-bookmark");
check((await d1Count(uuid)) === 10000, "the restore brought the rows back");
await shot(page, "05-d1-time-travel-restored");
await clickText(page, ".undo button", "Undo this restore");
await waitText(page, ".undo", "Undone");
check((await d1Count(uuid)) === 0, "undoing the restore took them away again");
await shot(page, "06-d1-time-travel-undone");

// Import, with its MD5 etag computed in the browser.
await go(page, `#/d1/${uuid}/transfer`);
const sqlFile = join(work, "seed.sql");
writeFileSync(sqlFile, "CREATE TABLE imported (n INTEGER);\nINSERT INTO imported VALUES (1), (2), (3);\n");
const fileInput = await page.$("form[aria-label='Import SQL'] input[type=file]");
await fileInput.uploadFile(sqlFile);
await page.click("form[aria-label='Import SQL'] button[type=submit]");
await waitText(page, ".transfer", "Imported");
const imported = await api("POST", `/d1/database/${uuid}/query`, { sql: "SELECT sum(n) AS s FROM imported" });
check(imported[0].results[0].s === 6, "the import ran");
await clickText(page, ".transfer button", "Export as SQL");
await waitText(page, ".transfer a.button", "Download");
await shot(page, "07-d1-export-import");

await go(page, "#/d1");
await waitText(page, "td a", "shop");
await shot(page, "08-d1-databases");

// ---- R2 ----
await go(page, "#/r2");
await page.click("details.panel summary");
await page.type("form[aria-label='Create a bucket'] input[name=bucket]", "media");
await page.click("form[aria-label='Create a bucket'] button[type=submit]");
await page.waitForFunction(() => document.querySelector("h1")?.textContent === "media");

const big = join(work, "clip.bin");
const bigBytes = randomBytes(20 << 20);
writeFileSync(big, bigBytes);
const bigHash = createHash("sha256").update(bigBytes).digest("hex");
await page.$eval("form[aria-label='Upload files'] input[name=prefix]", (el) => (el.value = "videos/"));
await (await page.$("form[aria-label='Upload files'] input[type=file]")).uploadFile(big);
await page.click("form[aria-label='Upload files'] button[type=submit]");
await waitText(page, ".uploads", "Uploaded (20 MiB)", 30_000);
await shot(page, "09-r2-uploaded");
await waitText(page, "td a", "videos/");
await clickText(page, "td a", "videos/");
await waitText(page, "td a", "clip.bin");
await clickText(page, "td a", "clip.bin");
await waitText(page, "dd", "20971520 bytes");
await clickText(page, "button", "Download");
let downloaded;
for (let i = 0; i < 100 && !downloaded; i++) {
  await new Promise((r) => setTimeout(r, 200));
  const done = readdirSync(downloads).filter((f) => f === "clip.bin");
  if (done.length && statSync(join(downloads, "clip.bin")).size === bigBytes.length) downloaded = join(downloads, "clip.bin");
}
check(downloaded, "the download finished");
check(createHash("sha256").update(readFileSync(downloaded)).digest("hex") === bigHash, "the 20 MiB download is byte-identical");
const multipartEtag = await page.evaluate(() => [...document.querySelectorAll("dd")][2].textContent);
check(/-3$/.test(multipartEtag), `the upload went in 3 parts (ETag ${multipartEtag})`);

// A presigned URL made in the browser, fetched from outside it.
await page.click("details.panel summary");
await page.click("form[aria-label='Generate a presigned URL'] button[type=submit]");
await page.waitForSelector("textarea.presigned");
const presigned = await page.$eval("textarea.presigned", (e) => e.value);
const fetched = await fetch(presigned);
check(fetched.status === 200, `the presigned URL works (${fetched.status})`);
check(createHash("sha256").update(Buffer.from(await fetched.arrayBuffer())).digest("hex") === bigHash, "it serves the object");
await shot(page, "10-r2-object");

// An object whose key and metadata hold markup.
const hostileKey = `<img src=x onerror="window.__xss = 3">.txt`;
const metadata = new TextEncoder().encode(JSON.stringify({ version: 1, method: "put", object: hostileKey, customFields: [{ k: "note", v: "<script>window.__xss = 4</script>" }], httpFields: { contentType: "text/plain" } }));
const put = await fetch(`${KURA_URL}/binding/r2/media`, {
  method: "PUT",
  headers: { authorization: `Bearer ${KURA_API_TOKEN}`, "cf-r2-metadata-size": String(metadata.length) },
  body: Buffer.concat([metadata, Buffer.from("hi")]),
});
check(put.ok, "the hostile object was stored");
await go(page, "#/r2/media");
await waitText(page, "td a", hostileKey);
await clickText(page, "td a", hostileKey);
await waitText(page, "dd", "<script>window.__xss = 4</script>");
check(true, "an object key and metadata value holding markup are shown as text");
await shot(page, "11-r2-hostile-object");
await go(page, "#/r2/media");
await waitText(page, "td a", "videos/");
await shot(page, "12-r2-bucket");
// The skip link moves focus to the content and keeps the page.
await page.focus(".skip");
await page.keyboard.press("Enter");
check(await page.evaluate(() => location.hash === "#/r2/media" && document.activeElement.id === "main"), "the skip link keeps the page and focuses its content");

// ---- Workers KV ----
await go(page, "#/kv");
await page.type("form[aria-label='Create a namespace'] input[name=title]", "sessions");
await page.click("form[aria-label='Create a namespace'] button[type=submit]");
await page.waitForFunction(() => document.querySelector("h1")?.textContent === "sessions");
const kvId = decodeURIComponent(await page.evaluate(() => location.hash.split("/")[2]));
await api("PUT", `/storage/kv/namespaces/${kvId}/bulk`, Array.from({ length: 150 }, (_, i) => ({ key: `user:${String(i).padStart(3, "0")}`, value: `session ${i}` })));
await go(page, `#/kv/${kvId}?prefix=user%3A`);
await waitText(page, ".page-count", "100 keys on this page");
await clickText(page, "a", "Next page →");
await waitText(page, ".page-count", "50 keys on this page");
await waitText(page, "td a", "user:149");
check(true, "150 keys are paged 100 at a time");
await shot(page, "12b-kv-keys");
await page.type("form[aria-label='Write a key'] input[name=key]", "note:<b>");
await page.type("form[aria-label='Write a key'] textarea[name=value]", "hello <i>kv</i>");
await page.type("form[aria-label='Write a key'] input[name=metadata]", '{"by": "console"}');
await page.type("form[aria-label='Write a key'] input[name=ttl]", "3600");
await page.click("form[aria-label='Write a key'] button[type=submit]");
await waitText(page, "pre.value", "hello <i>kv</i>");
await waitText(page, "td code", '{"by":"console"}');
check(await page.evaluate(() => ![["", "never"]].flat().includes(document.querySelectorAll("td")[1]?.textContent ?? "")), "the key shows when it expires");
await shot(page, "12c-kv-key");
await clickText(page, "button", "Delete key");
await waitText(page, "h1", "sessions");
const gone = await fetch(`${KURA_URL}/client/v4/accounts/${KURA_ACCOUNT_ID}/storage/kv/namespaces/${kvId}/values/${encodeURIComponent("note:<b>")}`, { headers: { authorization: `Bearer ${KURA_API_TOKEN}` } });
check(gone.status === 404, `the deleted key is gone (${gone.status})`);

// ---- Queues ----
const made = await api("POST", "/queues", { queue_name: "emails" });
await api("POST", "/queues", { queue_name: "emails-dlq" });
await api("POST", `/queues/${made.queue_id}/consumers`, { type: "http_pull", dead_letter_queue: "emails-dlq" });
await api("POST", `/queues/${made.queue_id}/messages/batch`, { messages: [{ body: { to: "<b>alice</b>" } }, { body: "hello", content_type: "text" }] });
await api("POST", `/queues/${made.queue_id}/messages/pull`, { batch_size: 1, visibility_timeout_ms: 600000 });
await go(page, "#/queues");
await waitText(page, "td a", "emails-dlq");
await clickText(page, "td a", "emails");
await waitText(page, "td", "HTTP pull → emails-dlq");
await waitText(page, "td", "in flight");
await waitText(page, "td code", '{"to":"<b>alice</b>"}');
check(await page.evaluate(() => [...document.querySelectorAll("td")].some((td) => td.textContent === "2")), "the backlog counts both messages");
await shot(page, "12d-queue");
await page.type("form[aria-label='Send a message'] textarea[name=body]", "from the console");
await page.click("form[aria-label='Send a message'] button[type=submit]");
await waitText(page, "td code", "from the console");
check(true, "a message sent from the console waits in the queue");

// ---- Durable Objects ----
await go(page, "#/do");
await clickText(page, "td a", "rooms");
await waitText(page, "td a", "lobby");
await waitText(page, "td a", "kitchen");
check(true, "a room's objects are listed by name");
await shot(page, "13-do-objects");
await clickText(page, "td a", "lobby");
await page.waitForSelector("form[aria-label='Run SQL on this object']");
await page.$eval("form[aria-label='Run SQL on this object'] textarea", (el) => (el.value = "SELECT body FROM messages"));
await page.click("form[aria-label='Run SQL on this object'] button[type=submit]");
await waitText(page, "td", "hello from the lobby");
await shot(page, "14-do-object-sql");
await go(page, "#/do/rooms?view=fan-out");
await page.$eval("form[aria-label='Query every object'] textarea", (el) => (el.value = "SELECT body FROM messages"));
await page.click("form[aria-label='Query every object'] button[type=submit]");
await waitText(page, "td", "hello from the kitchen");
await waitText(page, "td", "hello from the lobby");
check(true, "the fan-out answers from every room");
await shot(page, "15-do-fan-out");

// ---- Tokens ----
await go(page, "#/tokens");
await page.type("form[aria-label='Create a token'] input[name=name]", "reader");
await page.select("form[aria-label='Create a token'] select[name=scope]", "d1:read");
await page.click("form[aria-label='Create a token'] button[type=submit]");
await page.waitForSelector(".once input.secret");
const readerToken = await page.$eval(".once input.secret", (e) => e.value);
check(readerToken.length >= 40, "the new token's secret is shown once");
await shot(page, "16-tokens");

// A read-only token sees a read-only console.
const reader = await newPage();
current = reader;
await signIn(reader, readerToken);
const sections = await reader.$$eval("#nav a", (as) => as.map((a) => a.textContent));
check(sections.join() === "D1", `a d1:read token sees D1 only (${sections})`);
check(await reader.$eval(".who", (e) => e.textContent.includes("read-only")), "it is marked read-only");
await go(reader, "#/d1");
await waitText(reader, "td a", "shop");
check((await reader.$("details.panel")) === null, "no create form for a read-only token");
await go(reader, `#/d1/${uuid}/query`);
check(await reader.$eval("form small", (e) => e.textContent.includes("Read-only")), "the editor says writes are refused");
await shot(reader, "17-read-only");
await reader.close();
current = page;

// Only an admin manages tokens; a revoked token stops working at once.
const asReader = (path) => fetch(`${KURA_URL}/client/v4/accounts/${KURA_ACCOUNT_ID}${path}`, { headers: { authorization: `Bearer ${readerToken}` } });
check((await asReader("/tokens")).status === 403, "a d1:read token cannot list tokens");
const limitedAdmin = await api("POST", "/tokens", { name: "media admin", scope: "admin", buckets: ["media"] });
check(limitedAdmin.s3?.access_key_id === limitedAdmin.id, "an R2-reaching token comes with its S3 key pair");
const minted = await fetch(`${KURA_URL}/client/v4/accounts/${KURA_ACCOUNT_ID}/tokens`, {
  method: "POST",
  headers: { authorization: `Bearer ${limitedAdmin.value}`, "content-type": "application/json" },
  body: JSON.stringify({ name: "escape", scope: "admin" }),
});
check(minted.status === 403, `an admin token limited to buckets cannot mint an unlimited one (${minted.status})`);
check((await asReader("/d1/database")).status === 200, "it can list databases");
await go(page, "#/tokens");
await page.evaluate(() => [...document.querySelectorAll("tr")].find((tr) => tr.firstChild?.textContent === "reader").querySelector("button").click());
await page.waitForFunction(() => [...document.querySelectorAll("tr")].some((tr) => tr.firstChild?.textContent === "reader" && tr.textContent.includes("revoked")));
const afterRevoke = await asReader("/d1/database");
check(afterRevoke.status === 401 || afterRevoke.status === 403, `the revoked token is refused (${afterRevoke.status})`);

// ---- Workers: a Worker's Cron Triggers, its recent runs, and a live log ----
const upload = new FormData();
upload.append("metadata", new Blob([JSON.stringify({ main_module: "index.js", compatibility_date: "2025-06-01" })], { type: "application/json" }));
const code = `export default {
  fetch(request) { console.log("hello from", new URL(request.url).pathname); return new Response("hi"); },
  scheduled(controller) { console.log("cron ran:", controller.cron); },
};`;
upload.append("index.js", new Blob([code], { type: "application/javascript+module" }), "index.js");
const deployed = await fetch(`${KURA_URL}/client/v4/accounts/${KURA_ACCOUNT_ID}/workers/scripts/hello`, {
  method: "PUT",
  headers: { authorization: `Bearer ${KURA_API_TOKEN}` },
  body: upload,
});
check((await deployed.json()).success, "a Worker deploys through the API");
await api("PUT", "/workers/scripts/hello/schedules", [{ cron: "*/5 * * * *" }]);
await api("POST", "/workers/scripts/hello/schedules/trigger", { cron: "*/5 * * * *" });
let cronShown = false;
for (let i = 0; i < 40 && !cronShown; i++) {
  await go(page, "#/workers/hello");
  await page.waitForSelector("main h2");
  cronShown = await page.evaluate(() => document.querySelector("main").innerText.includes("cron ran: */5 * * * *"));
  if (!cronShown) await new Promise((r) => setTimeout(r, 250));
}
check(cronShown, "the cron run and its console output are among the recent logs");
check(await page.evaluate(() => [...document.querySelectorAll("main code")].some((c) => c.textContent === "*/5 * * * *")), "the schedule is listed");
await page.evaluate(() => [...document.querySelectorAll("main button")].find((b) => b.textContent === "Start live log").click());
await page.waitForFunction(() => document.querySelector("main [role=status]").textContent.startsWith("Streaming"));
let seen = false;
for (let i = 0; i < 40 && !seen; i++) {
  await fetch(`${KURA_WORKERS_URL}/from-the-console-test`);
  seen = await page.evaluate(() => document.querySelector("main table[aria-label='Live log'] tbody").innerText.includes("hello from /from-the-console-test"));
  if (!seen) await new Promise((r) => setTimeout(r, 250));
}
check(seen, "a request shows in the live log as it happens");
await shot(page, "23-worker-live-log");
await page.evaluate(() => [...document.querySelectorAll("main button")].find((b) => b.textContent === "Stop live log").click());
await page.waitForFunction(() => document.querySelector("main [role=status]").textContent === "Not streaming.");
check((await api("GET", "/workers/scripts/hello/tails")).length === 0, "stopping the live log closes its tail");

// ---- Phone width ----
const phone = await newPage(390, 844);
current = phone;
await signIn(phone, KURA_API_TOKEN);
for (const [hash, name] of [[`#/d1/${uuid}`, "18-phone-d1"], ["#/r2/media", "19-phone-r2"], ["#/do/rooms", "20-phone-do"], ["#/tokens", "21-phone-tokens"], [`#/d1/${uuid}/time-travel`, "22-phone-time-travel"]]) {
  await go(phone, hash);
  await phone.waitForSelector("main h1");
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `${hash} fits a phone's width (overflows by ${overflow}px)`);
  await shot(phone, name);
}
await phone.close();
current = page;

check(await page.evaluate(() => window.__xss === undefined), "no markup from data ran");
await browser.close();
assert.deepEqual(problems, [], `the console had problems:\n${problems.join("\n")}`);
console.log(`console: ${checks} checks passed; first load ${(firstLoadBytes / 1024).toFixed(1)} KiB compressed; screenshots in ${SCREENSHOTS}`);
} catch (e) {
  // What the page showed when it failed, for whoever reads the log.
  try {
    await current.screenshot({ path: join(SCREENSHOTS, "failure.png"), fullPage: true });
    console.error(`at ${current.url()}:\n${await current.$eval("body", (b) => b.innerText)}`);
  } catch {}
  console.error(`problems so far: ${problems.join("\n") || "none"}`);
  await browser.close();
  throw e;
} finally {
  // The upload, the download and the browser's profile: 40 MiB a run, on a disk CI shares.
  rmSync(work, { recursive: true, force: true });
}
