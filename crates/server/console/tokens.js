// API tokens: create with a scope and bucket limits (the secret and S3 key pair shown once),
// list, revoke. Only an admin token sees this page.

import { session, v4, acct, forget } from "./api.js";
import { h, fill, field, form, table, heading, when, toast, actionButton, confirmAction } from "./ui.js";

// The narrowest first: a token is made for one job.
const SCOPES = [
  ["d1:read", "D1: read"],
  ["d1:write", "D1: edit"],
  ["r2:write", "R2: edit"],
  ["r2:read", "R2: read"],
  ["do:write", "Durable Objects: edit"],
  ["do:read", "Durable Objects: read"],
  ["admin", "Admin: everything, including tokens"],
];

export async function page() {
  const listing = h("div", { class: "token-list" });
  await drawList(listing);
  const name = h("input", { name: "name", required: true, maxlength: 120, autocomplete: "off" });
  const scope = h("select", { name: "scope" }, SCOPES.map(([value, label]) => h("option", { value }, label)));
  const buckets = h("input", { name: "buckets", autocomplete: "off", spellcheck: "false", placeholder: "photos, backups" });
  const created = h("div", { "aria-live": "polite" });
  // A bucket limit means something only to tokens that reach R2.
  const reachesR2 = () => scope.value === "admin" || scope.value.startsWith("r2:");
  const syncBuckets = () => {
    buckets.disabled = !reachesR2();
    if (buckets.disabled) buckets.value = "";
  };
  scope.addEventListener("change", syncBuckets);
  syncBuckets();
  const create = form(
    [field("Name", name), field("Scope", scope), field("Limit to buckets", buckets, "Optional, comma-separated: the token (and its S3 key) reaches only these R2 buckets.")],
    "Create token",
    async () => {
      const limit = buckets.value.split(",").map((b) => b.trim()).filter(Boolean);
      const token = await v4("POST", acct("/tokens"), { name: name.value.trim(), scope: scope.value, buckets: limit.length ? limit : undefined });
      const secret = (label, value) => {
        const input = h("input", { readonly: true, class: "code secret", value, "aria-label": label });
        return h("div", { class: "field" }, h("span", { class: "label" }, label), input);
      };
      fill(
        created,
        h(
          "div",
          { class: "once", role: "alert" },
          h("h2", {}, "Copy these now: they are shown only once"),
          secret("API token", token.value),
          token.s3 ? [secret("S3 access key id", token.s3.access_key_id), secret("S3 secret access key", token.s3.secret_access_key)] : null,
          h("button", { type: "button", onclick: () => fill(created) }, "Done: I have copied them"),
        ),
      );
      toast(`Created ${token.name}`);
      name.value = "";
      buckets.value = "";
      await drawList(listing);
    },
    { "aria-label": "Create a token" },
  );

  return h(
    "section",
    {},
    heading([], "API tokens"),
    h("details", { class: "panel", open: true }, h("summary", {}, "Create a token"), create, created),
    listing,
  );
}

/** The account's tokens, fetched again. */
async function drawList(listing) {
  const tokens = await v4("GET", acct("/tokens"));
  const rows = tokens.map((t) => [
    t.name,
    h("code", {}, t.id),
    t.scope,
    t.scope === "admin" || t.scope.startsWith("r2:") ? (t.buckets ? t.buckets.join(", ") : "all") : "—",
    when(t.issued_on),
    t.status === "revoked" ? `revoked ${when(t.revoked_on)}` : "active",
    t.status === "revoked"
      ? ""
      : actionButton(t.id === session.tokenInfo.id ? "Revoke (this session's)" : "Revoke", async () => {
          if (!confirmAction(`Revoke ${t.name}? Clients using it stop working at once.`)) return;
          await v4("DELETE", acct(`/tokens/${encodeURIComponent(t.id)}`));
          toast(`Revoked ${t.name}`);
          if (t.id === session.tokenInfo.id) {
            // This session's own token: it no longer works, so sign out.
            forget();
            location.hash = "#/";
            window.dispatchEvent(new HashChangeEvent("hashchange"));
            return;
          }
          await drawList(listing);
        }, { class: "danger small", "aria-label": `Revoke ${t.name}` }),
  ]);
  fill(listing, table(["Name", "Id", "Scope", "Buckets", "Created", "Status", ""], rows));
}
