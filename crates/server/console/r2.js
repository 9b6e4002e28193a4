// R2: buckets, a folder browser that pages, object details, uploads (multipart with progress
// for big files), downloads, deletes and presigned URLs.

import { session, v4, acct, can, getObject, encodeKey, r2Write, presign } from "./api.js";
import { h, fill, field, form, table, heading, bytes, when, toast, progress, actionButton, confirmAction, saveBlob } from "./ui.js";

const PAGE_KEYS = 100;
/** Files past this go up in parts, each its own request (R2's parts are 5 MiB to 5 GiB). */
const MULTIPART_ABOVE = 10 << 20;
const PART_SIZE = 8 << 20;

function bucketPath(bucket, rest = "") {
  return acct(`/r2/buckets/${encodeURIComponent(bucket)}${rest}`);
}

function browseHref(bucket, prefix, cursor) {
  const q = new URLSearchParams();
  if (prefix) q.set("prefix", prefix);
  if (cursor) q.set("cursor", cursor);
  const query = q.toString();
  return `#/r2/${encodeURIComponent(bucket)}${query ? `?${query}` : ""}`;
}

function objectHref(bucket, key) {
  return `#/r2/${encodeURIComponent(bucket)}/object?${new URLSearchParams({ key })}`;
}

export async function page(parts, q) {
  if (parts.length === 0) return buckets();
  if (parts[1] === "object") return objectPage(parts[0], q.get("key") ?? "");
  return browse(parts[0], q.get("prefix") ?? "", q.get("cursor") ?? "");
}

async function buckets() {
  const answer = await v4("GET", acct("/r2/buckets"));
  const list = answer.buckets ?? answer;
  const rows = list.map((b) => [h("a", { href: browseHref(b.name) }, b.name), when(b.creation_date), b.location ?? ""]);
  const create = can("r2:write") && session.tokenInfo.buckets == null
    ? (() => {
        const name = h("input", { name: "bucket", required: true, autocomplete: "off", pattern: "[a-z0-9][a-z0-9\\-]{1,61}[a-z0-9]" });
        return h(
          "details",
          { class: "panel" },
          h("summary", {}, "Create a bucket"),
          form([field("Name", name, "3–63 lowercase letters, digits and hyphens")], "Create", async () => {
            await v4("POST", acct("/r2/buckets"), { name: name.value.trim() });
            toast(`Created ${name.value.trim()}`);
            location.hash = browseHref(name.value.trim());
          }, { "aria-label": "Create a bucket" }),
        );
      })()
    : null;
  return h("section", {}, heading([], "R2 buckets"), create, table(["Bucket", "Created", "Location"], rows, { empty: "No buckets yet." }));
}

async function browse(bucket, prefix, cursor) {
  const q = new URLSearchParams({ delimiter: "/", per_page: String(PAGE_KEYS) });
  if (prefix) q.set("prefix", prefix);
  if (cursor) q.set("cursor", cursor);
  const listing = await v4("GET", bucketPath(bucket, `/objects?${q}`), undefined, { envelope: true });
  const info = listing.result_info ?? {};
  const folders = (info.delimited ?? []).map((p) => [h("a", { href: browseHref(bucket, p), class: "folder" }, `${p.slice(prefix.length)}`), "", "folder", ""]);
  const objects = listing.result.map((o) => [
    h("a", { href: objectHref(bucket, o.key) }, o.key.slice(prefix.length)),
    bytes(o.size),
    o.http_metadata?.contentType ?? "",
    when(o.uploaded),
  ]);

  const trail = [["R2", "#/r2"], [bucket, browseHref(bucket)]];
  let path = "";
  for (const part of prefix.split("/").filter(Boolean).slice(0, -1)) {
    path += `${part}/`;
    trail.push([part, browseHref(bucket, path)]);
  }
  const pager = h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    cursor ? h("a", { href: browseHref(bucket, prefix) }, "← First page") : h("span", { class: "muted" }, "← First page"),
    h("span", { class: "page-count" }, `${folders.length + objects.length} entries on this page`),
    info.is_truncated && info.cursor ? h("a", { href: browseHref(bucket, prefix, info.cursor), rel: "next" }, "Next page →") : h("span", { class: "muted" }, "Next page →"),
  );

  const listingArea = h("div", {}, pager, table(["Name", "Size", "Type", "Uploaded"], [...folders, ...objects], { empty: prefix ? "Nothing under this prefix." : "This bucket is empty." }));
  // After an upload only the listing is drawn again, so the upload's progress stays in view.
  const relist = async () => {
    const fresh = await browse(bucket, prefix, cursor);
    const area = fresh.querySelector(".listing");
    if (area) listingArea.replaceChildren(...area.childNodes);
  };
  listingArea.className = "listing";
  const tools = [];
  if (can("r2:write")) tools.push(uploadPanel(bucket, prefix, relist));
  tools.push(presignPanel(bucket, prefix));
  const actions = can("r2:write") && !prefix && !cursor
    ? actionButton("Delete bucket", async () => {
        if (!confirmAction(`Delete the bucket ${bucket}? It must be empty.`)) return;
        await v4("DELETE", bucketPath(bucket));
        toast(`Deleted ${bucket}`);
        location.hash = "#/r2";
      }, { class: "danger" })
    : null;
  return h(
    "section",
    {},
    heading(prefix ? trail : trail.slice(0, -1), prefix ? `${bucket}/${prefix}` : bucket),
    tools,
    listingArea,
    h("div", { class: "actions" }, actions),
  );
}

function uploadPanel(bucket, prefix, onUploaded) {
  const files = h("input", { type: "file", name: "files", multiple: true, required: true });
  const keyPrefix = h("input", { name: "prefix", value: prefix, autocomplete: "off", spellcheck: "false" });
  const status = h("div", { class: "uploads", "aria-live": "polite" });
  return h(
    "details",
    { class: "panel", open: true },
    h("summary", {}, "Upload"),
    form([field("Files", files), field("Key prefix", keyPrefix, "Each file's key is this prefix and its name.")], "Upload", async () => {
      fill(status);
      for (const file of files.files) {
        const key = `${keyPrefix.value}${file.name}`;
        const bar = progress(key);
        status.append(bar.el);
        await upload(bucket, key, file, (done) => bar.set(done, file.size));
        bar.finish(`Uploaded (${bytes(file.size)})`);
      }
      toast("Upload complete");
      await onUploaded();
    }, { "aria-label": "Upload files" }),
    status,
  );
}

/** One file: a single PUT, or a multipart upload whose parts report their progress. */
async function upload(bucket, key, file, onProgress) {
  const httpFields = file.type ? { contentType: file.type } : {};
  if (file.size <= MULTIPART_ABOVE) {
    await r2Write(bucket, { method: "put", object: key, httpFields }, file, onProgress);
    return;
  }
  const { uploadId } = await r2Write(bucket, { method: "createMultipartUpload", object: key, httpFields });
  const parts = [];
  try {
    for (let offset = 0, partNumber = 1; offset < file.size; offset += PART_SIZE, partNumber++) {
      const body = file.slice(offset, offset + PART_SIZE);
      const { etag } = await r2Write(bucket, { method: "uploadPart", object: key, uploadId, partNumber }, body, (sent) => onProgress(offset + sent));
      parts.push({ part: partNumber, etag });
      onProgress(Math.min(offset + PART_SIZE, file.size));
    }
    await r2Write(bucket, { method: "completeMultipartUpload", object: key, uploadId, parts });
  } catch (e) {
    await r2Write(bucket, { method: "abortMultipartUpload", object: key, uploadId }).catch(() => {});
    throw e;
  }
}

function s3Endpoint() {
  const s3 = session.config?.s3;
  if (!s3) return null;
  return `${location.protocol}//${s3.host ?? location.hostname}:${s3.port}`;
}

function presignPanel(bucket, key) {
  const endpoint = s3Endpoint();
  if (!endpoint || !can("r2:read")) return null;
  const keyInput = h("input", { name: "key", value: key, required: true, autocomplete: "off", spellcheck: "false" });
  const method = h("select", { name: "method" }, h("option", { value: "GET" }, "GET (download)"), can("r2:write") ? h("option", { value: "PUT" }, "PUT (upload)") : null);
  const expires = h("input", { name: "expires", type: "number", min: 1, max: 604800, value: 3600, required: true });
  const out = h("div", { "aria-live": "polite" });
  return h(
    "details",
    { class: "panel" },
    h("summary", {}, "Presigned URL"),
    h("p", { class: "muted" }, "Signed in this browser with the S3 key R2 derives from your token; anyone holding the URL can use it until it expires."),
    form([field("Key", keyInput), field("Method", method), field("Expires in (seconds)", expires)], "Generate", async () => {
      const url = await presign({ endpoint, bucket, key: keyInput.value, method: method.value, expires: Number(expires.value) });
      const output = h("textarea", { class: "code presigned", rows: 3, readonly: true, "aria-label": "Presigned URL" });
      output.value = url;
      fill(out, field("URL", output), actionButton("Copy", async () => { await navigator.clipboard.writeText(url); toast("Copied"); }));
    }, { "aria-label": "Generate a presigned URL" }),
    out,
  );
}

async function objectPage(bucket, key) {
  // The smallest key under the prefix `key` is `key` itself when it exists.
  const listing = await v4("GET", bucketPath(bucket, `/objects?${new URLSearchParams({ prefix: key, per_page: "1" })}`));
  const object = listing.find((o) => o.key === key);
  const trail = [["R2", "#/r2"], [bucket, browseHref(bucket)]];
  const folder = key.includes("/") ? key.slice(0, key.lastIndexOf("/") + 1) : "";
  if (folder) trail.push([folder, browseHref(bucket, folder)]);
  if (!object) return h("section", {}, heading(trail, key), h("p", {}, "No such object."));
  const http = object.http_metadata ?? {};
  const custom = object.custom_metadata ?? {};
  const facts = [
    ["Key", object.key],
    ["Size", `${bytes(object.size)} (${object.size} bytes)`],
    ["ETag", object.etag],
    ["Uploaded", when(object.uploaded)],
    ["Storage class", object.storage_class],
    ["Version", object.version],
  ];
  const detail = (pairs) => h("dl", { class: "facts-list" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v ?? ""))]));
  const download = actionButton("Download", async () => {
    const blob = await getObject(bucket, key);
    saveBlob(blob, key.split("/").pop() || "object");
  }, { class: "primary" });
  const remove = can("r2:write")
    ? actionButton("Delete", async () => {
        if (!confirmAction(`Delete ${key}?`)) return;
        await v4("DELETE", bucketPath(bucket, `/objects/${encodeKey(key)}`));
        toast(`Deleted ${key}`);
        location.hash = browseHref(bucket, folder);
      }, { class: "danger" })
    : null;
  return h(
    "section",
    {},
    heading(trail, key.slice(folder.length)),
    h("div", { class: "actions" }, download, remove),
    h("h2", {}, "Object"),
    detail(facts),
    h("h2", {}, "HTTP metadata"),
    Object.keys(http).length ? detail(Object.entries(http)) : h("p", { class: "muted" }, "None."),
    h("h2", {}, "Custom metadata"),
    Object.keys(custom).length ? detail(Object.entries(custom)) : h("p", { class: "muted" }, "None."),
    presignPanel(bucket, key),
  );
}
