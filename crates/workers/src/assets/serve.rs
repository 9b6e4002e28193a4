//! Serving a version's assets as Cloudflare does: which requests reach the Worker first
//! (`run_worker_first`, route patterns), `_redirects` (redirects and 200 rewrites),
//! `html_handling` (where each HTML page is served and which spellings redirect there),
//! `not_found_handling`, then the file with its ETag (`If-None-Match` → 304), ranges, and the
//! `_headers` rules on every answer the assets give.

use std::collections::HashMap;
use std::path::PathBuf;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;

use super::{Asset, AssetsConfig, HtmlHandling, NotFoundHandling, RunWorkerFirst, VersionAssets};
use crate::error::{Result, WorkersError};

/// Checks `run_worker_first` patterns as wrangler does before it uploads them.
pub fn check_rules(rules: &[String]) -> Result<()> {
    let invalid = |m: String| Err(WorkersError::InvalidAssets(m));
    if rules.is_empty() || rules.len() > 100 {
        return invalid(format!("run_worker_first must list 1 to 100 rules, not {}", rules.len()));
    }
    let mut seen = std::collections::HashSet::new();
    for rule in rules {
        if !(rule.starts_with('/') || rule.starts_with("!/")) || rule.len() > 100 {
            return invalid(format!(
                "run_worker_first rule '{rule}' must start with '/' or '!/' and be at most 100 characters"
            ));
        }
        if !seen.insert(rule) {
            return invalid(format!("run_worker_first rule '{rule}' is listed twice"));
        }
    }
    if rules.iter().all(|r| r.starts_with('!')) {
        return invalid("run_worker_first needs at least one rule that sends requests to the Worker".into());
    }
    Ok(())
}

/// A path pattern of `_redirects`, `_headers` and `run_worker_first`: literal text, `*` (any
/// characters, `/` included: the first is the splat) and `:name` (one segment) — anchored at
/// both ends. Matched by the `regex` crate, in time linear in the path whatever the pattern.
#[derive(Debug, Clone)]
struct Pattern {
    /// The text itself, when the pattern has neither splat nor placeholder.
    literal: Option<String>,
    regex: regex::Regex,
}

impl Pattern {
    /// `None` for a pattern no regex can say (a placeholder named twice).
    fn parse(text: &str, placeholders: bool) -> Option<Pattern> {
        let mut regex = String::from("^");
        let mut literal = true;
        let mut splat = false;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            let starts_name = chars.peek().is_some_and(|n| n.is_ascii_alphabetic());
            if c == '*' {
                regex.push_str(if splat { ".*" } else { "(?P<splat>.*)" });
                splat = true;
                literal = false;
            } else if c == ':' && placeholders && starts_name {
                let mut name = String::new();
                while let Some(&n) = chars.peek().filter(|n| n.is_ascii_alphanumeric() || **n == '_') {
                    name.push(n);
                    chars.next();
                }
                regex.push_str(&format!("(?P<{name}>[^/]+)"));
                literal = false;
            } else {
                regex.push_str(&regex::escape(&c.to_string()));
            }
        }
        regex.push('$');
        let regex = regex::Regex::new(&regex).ok()?;
        Some(Pattern { literal: literal.then(|| text.to_owned()), regex })
    }

    fn is_static(&self) -> bool {
        self.literal.is_some()
    }

    /// The captures (`splat` and the placeholders) if `path` matches.
    fn matches(&self, path: &str) -> Option<HashMap<String, String>> {
        if let Some(literal) = &self.literal {
            return (literal == path).then(HashMap::new);
        }
        let captures = self.regex.captures(path)?;
        Some(
            self.regex
                .capture_names()
                .flatten()
                .filter_map(|name| captures.name(name).map(|m| (name.to_owned(), m.as_str().to_owned())))
                .collect(),
        )
    }
}

fn substitute(text: &str, captures: &HashMap<String, String>) -> String {
    let mut names: Vec<&String> = captures.keys().collect();
    // `:splat` before `:s`, the longer name first.
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = text.to_owned();
    for name in names {
        out = out.replace(&format!(":{name}"), &captures[name]);
    }
    out
}

/// One `_redirects` rule.
#[derive(Debug, Clone)]
struct Redirect {
    /// The host an absolute source names.
    host: Option<String>,
    from: Pattern,
    to: String,
    status: u16,
    /// A literal rule before the first dynamic one: looked up by exact path, ahead of the
    /// rest. A literal rule after a dynamic one takes its turn in order, as on Cloudflare.
    early: bool,
}

/// One `_headers` rule.
#[derive(Debug, Clone)]
struct HeaderRule {
    host: Option<String>,
    path: Pattern,
    set: Vec<(String, String)>,
    unset: Vec<String>,
}

/// A version's `_redirects`, `_headers` and `run_worker_first` rules, parsed once.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    redirects: Vec<Redirect>,
    headers: Vec<HeaderRule>,
    to_worker: Vec<Pattern>,
    to_assets: Vec<Pattern>,
}

/// `https://host/path` → (Some(host), path); `/path` → (None, path).
fn split_source(source: &str) -> Option<(Option<String>, &str)> {
    if source.starts_with('/') {
        return Some((None, source));
    }
    let rest = source.strip_prefix("https://").or_else(|| source.strip_prefix("http://"))?;
    let slash = rest.find('/').unwrap_or(rest.len());
    let path = if slash == rest.len() { "/" } else { &rest[slash..] };
    Some((Some(rest[..slash].to_ascii_lowercase()), path))
}

impl Rules {
    /// Parses a version's rules. Lines Cloudflare would skip (malformed, over a limit) are
    /// skipped and logged; nothing here fails a deploy that Cloudflare takes.
    pub fn parse(config: &AssetsConfig) -> Result<Rules> {
        let mut rules = Rules::default();
        if let Some(text) = &config.redirects {
            let mut sources = std::collections::HashSet::new();
            let (mut statics, mut dynamics) = (0, 0);
            for (number, line) in text.lines().enumerate() {
                if line.len() > 2000 {
                    tracing::warn!(line = number + 1, "_redirects: skipped a line over 2,000 characters");
                    continue;
                }
                let line = line.split(" #").next().unwrap_or("").trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let tokens: Vec<&str> = line.split_whitespace().collect();
                let status = match tokens.get(2).map(|s| s.parse::<u16>()) {
                    None => 302,
                    Some(Ok(s)) if [200, 301, 302, 303, 307, 308].contains(&s) => s,
                    Some(_) => {
                        tracing::warn!(
                            line = number + 1,
                            "_redirects: skipped a rule with a status Cloudflare does not take"
                        );
                        continue;
                    }
                };
                let (Some((host, path)), true) = (split_source(tokens[0]), (2..=3).contains(&tokens.len())) else {
                    tracing::warn!(line = number + 1, "_redirects: skipped a malformed rule");
                    continue;
                };
                let to = tokens[1].to_owned();
                let Some(from) = Pattern::parse(path, true).filter(|_| path.matches('*').count() <= 1) else {
                    tracing::warn!(
                        line = number + 1,
                        "_redirects: skipped a rule with two splats or a repeated placeholder"
                    );
                    continue;
                };
                // Rules that would loop with html_handling, which Cloudflare refuses: `/* →
                // /index.html` everywhere, and `/dir/ → /dir/index.html`.
                let to_index = !to.contains("://") && (to.ends_with("/index") || to.ends_with("/index.html"));
                let loops = to_index
                    && (path.ends_with("/*") || (path.ends_with('/') && config.html_handling != HtmlHandling::None));
                if loops {
                    tracing::warn!(
                        line = number + 1,
                        "_redirects: skipped a rule that would loop (the files serve there already)"
                    );
                    continue;
                }
                let early = from.is_static() && dynamics == 0;
                let over = if early {
                    statics += 1;
                    statics > 2000
                } else {
                    dynamics += 1;
                    dynamics > 100
                };
                let absolute_proxy = status == 200 && !to.starts_with('/');
                if over || absolute_proxy || !sources.insert(tokens[0]) {
                    tracing::warn!(
                        line = number + 1,
                        "_redirects: skipped a rule (over the limit, a duplicate, or a 200 to another site)"
                    );
                    continue;
                }
                rules.redirects.push(Redirect { host, from, to, status, early });
            }
        }
        if let Some(text) = &config.headers {
            for line in text.lines() {
                let trimmed = line.trim();
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
                if !line.starts_with(char::is_whitespace)
                    && let Some((host, path)) = split_source(trimmed)
                {
                    if rules.headers.len() == 100 {
                        tracing::warn!("_headers: rules past the 100th are skipped");
                        break;
                    }
                    let Some(pattern) = Pattern::parse(path, true).filter(|_| path.matches('*').count() <= 1) else {
                        tracing::warn!("_headers: skipped a rule with two splats or a repeated placeholder");
                        continue;
                    };
                    rules.headers.push(HeaderRule { host, path: pattern, set: Vec::new(), unset: Vec::new() });
                    continue;
                }
                let Some(rule) = rules.headers.last_mut() else { continue };
                if let Some(name) = trimmed.strip_prefix('!') {
                    rule.unset.push(name.trim().to_ascii_lowercase());
                } else if let Some((name, value)) = trimmed.split_once(':') {
                    let name = name.trim().to_ascii_lowercase();
                    match rule.set.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, existing)) => {
                            existing.push_str(", ");
                            existing.push_str(value.trim());
                        }
                        None => rule.set.push((name, value.trim().to_owned())),
                    }
                }
            }
        }
        if let RunWorkerFirst::Patterns(patterns) = &config.run_worker_first {
            for rule in patterns {
                match rule.strip_prefix('!') {
                    Some(assets) => rules.to_assets.extend(Pattern::parse(assets, false)),
                    None => rules.to_worker.extend(Pattern::parse(rule, false)),
                }
            }
        }
        Ok(rules)
    }

    fn redirect(&self, host: &str, path: &str) -> Option<(u16, String)> {
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let applies = |r: &&Redirect| r.host.as_ref().is_none_or(|h| *h == host);
        // The early literal rules by exact path first, then the others in order.
        let exact = self.redirects.iter().filter(applies).filter(|r| r.early).find(|r| r.from.matches(path).is_some());
        if let Some(rule) = exact {
            return Some((rule.status, rule.to.clone()));
        }
        self.redirects.iter().filter(applies).filter(|r| !r.early).find_map(|r| {
            let captures = r.from.matches(path)?;
            let mut to = substitute(&r.to, &captures);
            // A splat holding `//evil.example` must not make the target another site's.
            if to.starts_with('/') {
                while to.contains("//") {
                    to = to.replace("//", "/");
                }
            }
            Some((r.status, to))
        })
    }

    fn apply_headers(&self, host: &str, path: &str, headers: &mut HeaderMap) {
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let mut set_here: std::collections::HashSet<String> = std::collections::HashSet::new();
        for rule in &self.headers {
            if rule.host.as_ref().is_some_and(|h| *h != host) {
                continue;
            }
            let Some(captures) = rule.path.matches(path) else { continue };
            for name in &rule.unset {
                headers.remove(name.as_str());
            }
            for (name, value) in &rule.set {
                let (Ok(name), Ok(value)) =
                    (HeaderName::try_from(name.as_str()), HeaderValue::from_str(&substitute(value, &captures)))
                else {
                    continue;
                };
                if set_here.insert(name.to_string()) {
                    headers.insert(name, value);
                } else if let Some(existing) = headers.get(&name).and_then(|v| v.to_str().ok())
                    && let Ok(joined) = HeaderValue::from_str(&format!("{existing}, {}", value.to_str().unwrap_or("")))
                {
                    headers.insert(name, joined);
                }
            }
        }
    }
}

/// Where a request goes.
pub enum Decision {
    /// To the Worker.
    Worker,
    /// Answered by the assets.
    Assets(Response),
}

/// What the assets decided, before the file is read.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// No file, no rule: the Worker's, or an empty 404.
    NoIntent,
    /// A 200 rewrite found no file: a 404 the Worker does not get.
    NotFound,
    MethodNotAllowed,
    Redirect(u16, String),
    Serve {
        hash: String,
        status: u16,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Intent {
    Asset { hash: String, status: u16 },
    Redirect(String),
}

/// A deployed version's assets, ready to serve.
pub struct ServedAssets {
    files: HashMap<String, Asset>,
    by_hash: HashMap<String, Asset>,
    config: AssetsConfig,
    rules: Rules,
    has_user_worker: bool,
    /// `Sec-Fetch-Mode: navigate` requests get `not_found_handling` before the Worker
    /// (`assets_navigation_prefers_asset_serving`, on from 2025-04-01).
    navigation_prefers_assets: bool,
    store: PathBuf,
}

impl ServedAssets {
    /// A version's assets; `store` is where their files are, by hash.
    pub fn new(
        assets: VersionAssets,
        has_user_worker: bool,
        compatibility: (&str, &[String]),
        store: PathBuf,
    ) -> Result<ServedAssets> {
        let (date, flags) = compatibility;
        let flag = |f: &str| flags.iter().any(|g| g == f);
        let navigation_prefers_assets = flag("assets_navigation_prefers_asset_serving")
            || (date >= "2025-04-01" && !flag("assets_navigation_has_no_effect"));
        Ok(ServedAssets {
            rules: Rules::parse(&assets.config)?,
            by_hash: assets.files.values().map(|a| (a.hash.clone(), a.clone())).collect(),
            files: assets.files.into_iter().collect(),
            config: assets.config,
            has_user_worker,
            navigation_prefers_assets,
            store,
        })
    }

    /// Decides where a request goes, and answers it if the assets do.
    pub async fn route(&self, method: &Method, uri: &axum::http::Uri, request: &HeaderMap) -> Decision {
        let path = uri.path();
        let host = request.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let mut decided = None;
        if self.has_user_worker {
            let to_assets = self.rules.to_assets.iter().any(|p| p.matches(path).is_some());
            let to_worker = self.rules.to_worker.iter().any(|p| p.matches(path).is_some());
            if !to_assets && (to_worker || self.config.run_worker_first == RunWorkerFirst::Always(true)) {
                return Decision::Worker;
            }
            if !to_assets {
                // Route patterns (Cloudflare's "static routing") keep `not_found_handling` for
                // every request; otherwise only a browser's navigation does (from 2025-04-01).
                let navigation = self.navigation_prefers_assets
                    && request.get("sec-fetch-mode").is_some_and(|m| m.as_bytes() == b"navigate");
                let static_routing = matches!(self.config.run_worker_first, RunWorkerFirst::Patterns(_));
                let keep = navigation || static_routing;
                let not_found = if keep { self.config.not_found_handling } else { NotFoundHandling::None };
                let outcome = self.outcome(method, uri, host, not_found);
                if outcome == Outcome::NoIntent {
                    return Decision::Worker;
                }
                // Decided under the version's own handling: the answer is that outcome.
                decided = (not_found == self.config.not_found_handling).then_some(outcome);
            }
        }
        let outcome = decided.unwrap_or_else(|| self.outcome(method, uri, host, self.config.not_found_handling));
        Decision::Assets(self.respond(method, uri, request, outcome).await)
    }

    /// The assets' answer to a request, whatever `run_worker_first` says (`env.ASSETS.fetch`).
    pub async fn answer(&self, method: &Method, uri: &axum::http::Uri, request: &HeaderMap) -> Response {
        let host = request.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let outcome = self.outcome(method, uri, host, self.config.not_found_handling);
        self.respond(method, uri, request, outcome).await
    }

    async fn respond(&self, method: &Method, uri: &axum::http::Uri, request: &HeaderMap, outcome: Outcome) -> Response {
        let host = request.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let mut response = match outcome {
            Outcome::NoIntent | Outcome::NotFound => empty(StatusCode::NOT_FOUND),
            Outcome::MethodNotAllowed => empty(StatusCode::METHOD_NOT_ALLOWED),
            Outcome::Redirect(status, location) => {
                let mut response = empty(StatusCode::from_u16(status).unwrap_or(StatusCode::FOUND));
                if let Ok(location) = HeaderValue::from_str(&location) {
                    response.headers_mut().insert(header::LOCATION, location);
                }
                response
            }
            Outcome::Serve { hash, status } => self.serve(method, request, &hash, status).await,
        };
        self.rules.apply_headers(host, uri.path(), response.headers_mut());
        response
    }

    fn outcome(&self, method: &Method, uri: &axum::http::Uri, host: &str, not_found: NotFoundHandling) -> Outcome {
        let search = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        let mut pathname = uri.path().to_owned();
        let mut proxied = false;
        if let Some((status, to)) = self.rules.redirect(host, &pathname) {
            if status == 200 {
                pathname = to.split(['?', '#']).next().unwrap_or("/").to_owned();
                proxied = true;
            } else {
                // The request's query goes along unless the target has its own.
                let location = if !to.contains('?') {
                    let (path, fragment) =
                        to.split_once('#').map_or((to.as_str(), String::new()), |(p, f)| (p, format!("#{f}")));
                    format!("{path}{search}{fragment}")
                } else {
                    to
                };
                return Outcome::Redirect(status, location);
            }
        }
        let decoded = decode_path(&pathname);
        let Some(intent) = self.intent(&decoded, not_found, false) else {
            return if proxied { Outcome::NotFound } else { Outcome::NoIntent };
        };
        if method != Method::GET && method != Method::HEAD {
            return Outcome::MethodNotAllowed;
        }
        match intent {
            Intent::Redirect(to) => Outcome::Redirect(307, format!("{}{search}", encode_path(&to))),
            Intent::Asset { hash, status } => {
                let canonical = encode_path(&decoded);
                if canonical != pathname {
                    return Outcome::Redirect(307, format!("{canonical}{search}"));
                }
                Outcome::Serve { hash, status }
            }
        }
    }

    fn exists(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(|a| a.hash.as_str())
    }

    fn asset(&self, path: &str) -> Option<Intent> {
        self.exists(path).map(|hash| Intent::Asset { hash: hash.to_owned(), status: 200 })
    }

    /// A redirect to `destination` if it serves the very file `file` is (and is no file itself).
    fn safe_redirect(&self, file: &str, destination: &str, not_found: NotFoundHandling, skip: bool) -> Option<Intent> {
        if skip || self.exists(destination).is_some() {
            return None;
        }
        match self.intent(destination, not_found, true) {
            Some(Intent::Asset { hash, .. }) if Some(hash.as_str()) == self.exists(file) => {
                Some(Intent::Redirect(destination.to_owned()))
            }
            _ => None,
        }
    }

    fn intent(&self, p: &str, nf: NotFoundHandling, skip: bool) -> Option<Intent> {
        let redirect = |file: &str, to: &str| self.safe_redirect(file, to, nf, skip);
        let found = match self.config.html_handling {
            HtmlHandling::None => self.asset(p),
            HtmlHandling::AutoTrailingSlash => {
                let early = if let Some(stem) = p.strip_suffix("/index") {
                    self.asset(p)
                        .or_else(|| redirect(&format!("{p}.html"), &format!("{stem}/")))
                        .or_else(|| redirect(&format!("{stem}.html"), stem))
                } else if let Some(stem) = p.strip_suffix("/index.html") {
                    redirect(p, &format!("{stem}/")).or_else(|| redirect(&format!("{stem}.html"), stem))
                } else if let Some(stem) = p.strip_suffix('/') {
                    self.asset(&format!("{p}index.html")).or_else(|| redirect(&format!("{stem}.html"), stem))
                } else if let Some(stem) = p.strip_suffix(".html") {
                    redirect(p, stem).or_else(|| redirect(&format!("{stem}/index.html"), &format!("{stem}/")))
                } else {
                    None
                };
                early
                    .or_else(|| self.asset(p))
                    .or_else(|| self.asset(&format!("{p}.html")))
                    .or_else(|| redirect(&format!("{p}/index.html"), &format!("{p}/")))
            }
            HtmlHandling::ForceTrailingSlash => {
                let early = if let Some(stem) = p.strip_suffix("/index") {
                    self.asset(p)
                        .or_else(|| redirect(&format!("{p}.html"), &format!("{stem}/")))
                        .or_else(|| redirect(&format!("{stem}.html"), &format!("{stem}/")))
                } else if let Some(stem) = p.strip_suffix("/index.html") {
                    redirect(p, &format!("{stem}/")).or_else(|| redirect(&format!("{stem}.html"), &format!("{stem}/")))
                } else if let Some(stem) = p.strip_suffix('/') {
                    self.asset(&format!("{p}index.html")).or_else(|| self.asset(&format!("{stem}.html")))
                } else if let Some(stem) = p.strip_suffix(".html") {
                    redirect(p, &format!("{stem}/"))
                        .or_else(|| self.asset(p))
                        .or_else(|| redirect(&format!("{stem}/index.html"), &format!("{stem}/")))
                } else {
                    None
                };
                early
                    .or_else(|| self.asset(p))
                    .or_else(|| redirect(&format!("{p}.html"), &format!("{p}/")))
                    .or_else(|| redirect(&format!("{p}/index.html"), &format!("{p}/")))
            }
            HtmlHandling::DropTrailingSlash => {
                let early = if let Some(stem) = p.strip_suffix("/index") {
                    self.asset(p).or_else(|| {
                        if p == "/index" {
                            redirect("/index.html", "/")
                        } else {
                            redirect(&format!("{stem}.html"), stem).or_else(|| redirect(&format!("{p}.html"), stem))
                        }
                    })
                } else if let Some(stem) = p.strip_suffix("/index.html") {
                    if p == "/index.html" {
                        redirect("/index.html", "/")
                    } else {
                        redirect(p, stem).or_else(|| self.asset(p)).or_else(|| redirect(&format!("{stem}.html"), stem))
                    }
                } else if let Some(stem) = p.strip_suffix('/') {
                    if p == "/" {
                        self.asset("/index.html")
                    } else {
                        redirect(&format!("{stem}.html"), stem)
                            .or_else(|| redirect(&format!("{stem}/index.html"), stem))
                    }
                } else if let Some(stem) = p.strip_suffix(".html") {
                    redirect(p, stem).or_else(|| redirect(&format!("{stem}/index.html"), stem))
                } else {
                    None
                };
                early
                    .or_else(|| self.asset(p))
                    .or_else(|| self.asset(&format!("{p}.html")))
                    .or_else(|| self.asset(&format!("{p}/index.html")))
            }
        };
        found.or_else(|| self.not_found(p, nf))
    }

    fn not_found(&self, p: &str, nf: NotFoundHandling) -> Option<Intent> {
        match nf {
            NotFoundHandling::None => None,
            NotFoundHandling::SinglePageApplication => self.asset("/index.html"),
            NotFoundHandling::NotFoundPage => {
                let mut dir = p;
                while !dir.is_empty() {
                    dir = &dir[..dir.rfind('/').unwrap_or(0)];
                    if let Some(hash) = self.exists(&format!("{dir}/404.html")) {
                        return Some(Intent::Asset { hash: hash.to_owned(), status: 404 });
                    }
                }
                None
            }
        }
    }

    async fn serve(&self, method: &Method, request: &HeaderMap, hash: &str, status: u16) -> Response {
        let Some(asset) = self.by_hash.get(hash) else { return empty(StatusCode::NOT_FOUND) };
        let etag = format!("\"{hash}\"");
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex"));
        if let Some(content_type) = asset.content_type.as_deref().and_then(|t| HeaderValue::from_str(t).ok()) {
            headers.insert(header::CONTENT_TYPE, content_type);
        }
        if !request.contains_key(header::AUTHORIZATION) && !request.contains_key(header::RANGE) {
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=0, must-revalidate"));
        }
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        let if_none_match = request.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).unwrap_or("");
        if if_none_match == etag || if_none_match.strip_prefix("W/") == Some(etag.as_str()) {
            let mut response = empty(StatusCode::NOT_MODIFIED);
            *response.headers_mut() = headers;
            return response;
        }
        let range = match request.get(header::RANGE).and_then(|v| v.to_str().ok()) {
            Some(range) if status == 200 => match byte_range(range, asset.size) {
                Some(range) => Some(range),
                None => {
                    let mut response = empty(StatusCode::RANGE_NOT_SATISFIABLE);
                    *response.headers_mut() = headers;
                    let unsatisfied = HeaderValue::from_str(&format!("bytes */{}", asset.size)).expect("digits");
                    response.headers_mut().insert(header::CONTENT_RANGE, unsatisfied);
                    return response;
                }
            },
            _ => None,
        };
        let (start, len) = range.unwrap_or((0, asset.size));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        let mut status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        if range.is_some() {
            status = StatusCode::PARTIAL_CONTENT;
            let content_range = format!("bytes {start}-{}/{}", start + len - 1, asset.size);
            headers.insert(header::CONTENT_RANGE, HeaderValue::from_str(&content_range).expect("digits"));
        }
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            match open_range(&self.store.join(&hash[..2]).join(hash), start, len).await {
                Ok(body) => body,
                Err(e) => {
                    tracing::error!(hash, error = %e, "an asset's file could not be read");
                    return empty(StatusCode::INTERNAL_SERVER_ERROR);
                }
            }
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

async fn open_range(path: &std::path::Path, start: u64, len: u64) -> std::io::Result<Body> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = tokio::fs::File::open(path).await?;
    if start > 0 {
        file.seek(std::io::SeekFrom::Start(start)).await?;
    }
    // Small files (most of a site) in one read; larger ones streamed.
    if len <= 64 * 1024 {
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(len).read_to_end(&mut bytes).await?;
        return Ok(Body::from(bytes));
    }
    Ok(Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file.take(len), 64 * 1024)))
}

/// One range of `bytes=a-b`, `bytes=a-` or `bytes=-n` within `size`: (start, length).
fn byte_range(range: &str, size: u64) -> Option<(u64, u64)> {
    let spec = range.strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let (start, end) = if first.is_empty() {
        let suffix: u64 = last.parse().ok()?;
        (size.checked_sub(suffix.min(size))?, size.checked_sub(1)?)
    } else {
        let start: u64 = first.parse().ok()?;
        let end =
            if last.is_empty() { size.checked_sub(1)? } else { last.parse::<u64>().ok()?.min(size.checked_sub(1)?) };
        (start, end)
    };
    (start <= end && start < size).then(|| (start, end - start + 1))
}

fn empty(status: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    response
}

/// Each segment percent-decoded (a segment that does not decode stays as it is), repeated
/// slashes collapsed.
fn decode_path(path: &str) -> String {
    let decoded: Vec<String> = path
        .split('/')
        .map(|segment| {
            percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .map_or_else(|_| segment.to_owned(), |s| s.into_owned())
        })
        .collect();
    let mut joined = decoded.join("/");
    while joined.contains("//") {
        joined = joined.replace("//", "/");
    }
    joined
}

/// Each segment encoded as JavaScript's `encodeURIComponent` does.
fn encode_path(path: &str) -> String {
    const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'!')
        .remove(b'~')
        .remove(b'*')
        .remove(b'\'')
        .remove(b'(')
        .remove(b')');
    path.split('/')
        .map(|s| percent_encoding::utf8_percent_encode(s, COMPONENT).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(html_handling: HtmlHandling, not_found: NotFoundHandling, paths: &[&str]) -> ServedAssets {
        let files = paths
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), Asset { hash: format!("{i:032x}"), size: 1, content_type: None }))
            .collect();
        let config = AssetsConfig { html_handling, not_found_handling: not_found, ..Default::default() };
        ServedAssets::new(VersionAssets { files, config }, false, ("2025-06-01", &[]), PathBuf::new()).unwrap()
    }

    fn outcome(site: &ServedAssets, path: &str) -> String {
        let uri: axum::http::Uri = path.parse().unwrap();
        match site.outcome(&Method::GET, &uri, "example.com", site.config.not_found_handling) {
            Outcome::Serve { hash, status } => {
                let path = site.files.iter().find(|(_, a)| a.hash == hash).unwrap().0;
                format!("{status} {path}")
            }
            Outcome::Redirect(status, to) => format!("{status} -> {to}"),
            other => format!("{other:?}"),
        }
    }

    /// Cloudflare's html_handling table (reference §7.4), with `file.html` and
    /// `folder/index.html`; the two cells where its docs and its code differ follow the code.
    #[test]
    fn html_handling_follows_cloudflares_table() {
        let files = ["/file.html", "/folder/index.html"];
        let table: [(&str, [&str; 4]); 12] = [
            ("/file", ["200 /file.html", "307 -> /file/", "200 /file.html", "NoIntent"]),
            ("/file.html", ["307 -> /file", "307 -> /file/", "307 -> /file", "200 /file.html"]),
            ("/file/", ["307 -> /file", "200 /file.html", "307 -> /file", "NoIntent"]),
            ("/file/index", ["307 -> /file", "307 -> /file/", "307 -> /file", "NoIntent"]),
            ("/file/index.html", ["307 -> /file", "307 -> /file/", "307 -> /file", "NoIntent"]),
            ("/folder", ["307 -> /folder/", "307 -> /folder/", "200 /folder/index.html", "NoIntent"]),
            ("/folder.html", ["307 -> /folder/", "307 -> /folder/", "307 -> /folder", "NoIntent"]),
            ("/folder/", ["200 /folder/index.html", "200 /folder/index.html", "307 -> /folder", "NoIntent"]),
            ("/folder/index", ["307 -> /folder/", "307 -> /folder/", "307 -> /folder", "NoIntent"]),
            ("/folder/index.html", ["307 -> /folder/", "307 -> /folder/", "307 -> /folder", "200 /folder/index.html"]),
            ("/file?x=1", ["200 /file.html", "307 -> /file/?x=1", "200 /file.html", "NoIntent"]),
            ("/nothing", ["NoIntent", "NoIntent", "NoIntent", "NoIntent"]),
        ];
        let modes = [
            HtmlHandling::AutoTrailingSlash,
            HtmlHandling::ForceTrailingSlash,
            HtmlHandling::DropTrailingSlash,
            HtmlHandling::None,
        ];
        for (i, mode) in modes.into_iter().enumerate() {
            let site = site(mode, NotFoundHandling::None, &files);
            for (path, expected) in &table {
                assert_eq!(outcome(&site, path), expected[i], "{mode:?} {path}");
            }
        }
    }

    #[test]
    fn not_found_handling_and_encoded_paths() {
        let spa =
            site(HtmlHandling::AutoTrailingSlash, NotFoundHandling::SinglePageApplication, &["/index.html", "/app.js"]);
        assert_eq!(outcome(&spa, "/some/client/route"), "200 /index.html");
        assert_eq!(outcome(&spa, "/app.js"), "200 /app.js");
        let pages = site(
            HtmlHandling::AutoTrailingSlash,
            NotFoundHandling::NotFoundPage,
            &["/404.html", "/blog/404.html", "/é t.txt"],
        );
        assert_eq!(outcome(&pages, "/blog/missing/page"), "404 /blog/404.html");
        assert_eq!(outcome(&pages, "/missing"), "404 /404.html");
        assert_eq!(outcome(&pages, "/%C3%A9%20t.txt"), "200 /é t.txt");
        assert_eq!(outcome(&pages, "//%C3%A9%20t.txt"), "307 -> /%C3%A9%20t.txt");
        assert_eq!(outcome(&pages, "/%c3%a9%20t.txt"), "307 -> /%C3%A9%20t.txt", "the canonical spelling");
    }

    #[test]
    fn redirects_rewrite_and_headers_apply() {
        let config = AssetsConfig {
            redirects: Some(
                "# comment\n/old /new 301\n/blog/* /posts/:splat\n/users/:id /users/profile.html 200\n/go https://example.org/x\n/bad\n".into(),
            ),
            headers: Some("/*\n  X-Frame-Options: DENY\n/assets/:name\n  Cache-Control: max-age=3600\n  X-Name: :name\n  ! X-Frame-Options\n".into()),
            ..Default::default()
        };
        let rules = Rules::parse(&config).unwrap();
        assert_eq!(rules.redirect("h", "/old"), Some((301, "/new".into())));
        assert_eq!(rules.redirect("h", "/blog/2024/hello"), Some((302, "/posts/2024/hello".into())));
        assert_eq!(rules.redirect("h", "/users/42"), Some((200, "/users/profile.html".into())));
        assert_eq!(rules.redirect("h", "/users/42/more"), None, "a placeholder is one segment");
        assert_eq!(rules.redirect("h", "/go"), Some((302, "https://example.org/x".into())));
        assert_eq!(rules.redirects.len(), 4, "the malformed line is skipped");
        let mut headers = HeaderMap::new();
        rules.apply_headers("h", "/assets/app.js", &mut headers);
        assert_eq!(headers.get("cache-control").unwrap(), "max-age=3600");
        assert_eq!(headers.get("x-name").unwrap(), "app.js");
        assert!(headers.get("x-frame-options").is_none(), "unset by the later rule");
        let mut headers = HeaderMap::new();
        rules.apply_headers("h", "/index.html", &mut headers);
        assert_eq!(headers.get("x-frame-options").unwrap(), "DENY");
    }

    /// What the review of the first version found: a splat that makes a redirect leave the
    /// site, the SPA rule that loops, literal rules after a dynamic one, and patterns that
    /// backtrack without end.
    #[test]
    fn redirect_rules_neither_leave_the_site_nor_loop_nor_hang() {
        let config = AssetsConfig {
            redirects: Some(
                "/blog/* /:splat 301\n/* /index.html 200\n/docs/ /docs/index.html\n/a/* /b\n/a/x /c\n/two/*/* /x\n"
                    .into(),
            ),
            ..Default::default()
        };
        let rules = Rules::parse(&config).unwrap();
        assert_eq!(rules.redirect("h", "/blog//evil.example"), Some((301, "/evil.example".into())));
        assert_eq!(rules.redirects.len(), 3, "the looping SPA rule, the index rule and the two-splat rule are skipped");
        assert_eq!(
            rules.redirect("h", "/a/x"),
            Some((302, "/b".into())),
            "a literal rule after a dynamic one waits its turn"
        );
        let slow = Pattern::parse("/*/*/*/*/*.json", false).unwrap();
        let path = "/".repeat(20_000);
        let started = std::time::Instant::now();
        assert!(slow.matches(&path).is_none());
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{:?}", started.elapsed());
    }

    #[test]
    fn run_worker_first_rules_are_checked_and_ranges_read() {
        assert!(check_rules(&["/api/*".into(), "!/api/docs/*".into()]).is_ok());
        assert!(check_rules(&["!/only".into()]).is_err());
        assert!(check_rules(&["api".into()]).is_err());
        assert!(check_rules(&["/a".into(), "/a".into()]).is_err());
        assert_eq!(byte_range("bytes=0-9", 100), Some((0, 10)));
        assert_eq!(byte_range("bytes=90-", 100), Some((90, 10)));
        assert_eq!(byte_range("bytes=-5", 100), Some((95, 5)));
        assert_eq!(byte_range("bytes=100-", 100), None);
        assert_eq!(byte_range("bytes=0-1,3-4", 100), None);
    }
}
