//! What user SQL may do: D1's SQLite limits and its authorizer (developers.cloudflare.com/d1/platform/limits and
//! /d1/sql-api/sql-statements).
//!
//! D1 and Durable Objects run the same SQLite rules (workerd's), so one policy serves both.
//! The authorizer also records facts about the statement being prepared (which table it writes,
//! whether it changes the schema) that the meta counters use.

use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;

/// SQLite limits applied to every connection that runs user SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest string, BLOB or row, in bytes.
    pub max_value_bytes: i32,
    /// Longest single statement, in bytes.
    pub max_statement_bytes: i32,
    /// Most bound parameters in one statement.
    pub max_parameters: i32,
    /// Most columns in a table, index, view or result.
    pub max_columns: i32,
    /// Longest LIKE or GLOB pattern, in bytes.
    pub max_like_pattern_bytes: i32,
    /// Most terms in a compound SELECT.
    pub max_compound_select: i32,
    /// Deepest expression tree.
    pub max_expression_depth: i32,
    /// Most arguments to one SQL function.
    pub max_function_args: i32,
    /// Most virtual-machine instructions in one statement.
    pub max_vdbe_ops: i32,
    /// Deepest trigger recursion.
    pub max_trigger_depth: i32,
    /// Largest database file, in bytes.
    pub max_database_bytes: u64,
    /// Most bytes of results one request may collect (a guard against exhausting memory).
    pub max_result_bytes: usize,
}

impl Limits {
    /// D1's documented limits. Where the documentation and workerd differ (function arguments:
    /// 32 documented, 127 in workerd) kura follows workerd, so queries ORMs build against
    /// `wrangler dev` keep working; docs/compatibility.md records the choice.
    pub fn d1() -> Self {
        Limits {
            max_value_bytes: 2_000_000,
            max_statement_bytes: 100_000,
            max_parameters: 100,
            max_columns: 100,
            max_like_pattern_bytes: 50,
            max_compound_select: 5,
            max_expression_depth: 100,
            max_function_args: 127,
            max_vdbe_ops: 25_000,
            max_trigger_depth: 10,
            max_database_bytes: 10 * 1000 * 1000 * 1000,
            max_result_bytes: 64 * 1000 * 1000,
        }
    }

    /// Durable Objects' documented limits, which are D1's (2 MB values and rows, 100 bound
    /// parameters, 100 KB statements, 100 columns, 10 GB per object).
    pub fn durable_object() -> Self {
        Limits::d1()
    }

    /// Applies the limits to a connection.
    pub(crate) fn apply(&self, conn: &rusqlite::Connection) -> rusqlite::Result<()> {
        conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, self.max_value_bytes)?;
        conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, self.max_statement_bytes)?;
        conn.set_limit(Limit::SQLITE_LIMIT_VARIABLE_NUMBER, self.max_parameters)?;
        conn.set_limit(Limit::SQLITE_LIMIT_COLUMN, self.max_columns)?;
        conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, self.max_like_pattern_bytes)?;
        conn.set_limit(Limit::SQLITE_LIMIT_COMPOUND_SELECT, self.max_compound_select)?;
        conn.set_limit(Limit::SQLITE_LIMIT_EXPR_DEPTH, self.max_expression_depth)?;
        conn.set_limit(Limit::SQLITE_LIMIT_FUNCTION_ARG, self.max_function_args)?;
        conn.set_limit(Limit::SQLITE_LIMIT_VDBE_OP, self.max_vdbe_ops)?;
        conn.set_limit(Limit::SQLITE_LIMIT_TRIGGER_DEPTH, self.max_trigger_depth)?;
        conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
        conn.set_limit(Limit::SQLITE_LIMIT_WORKER_THREADS, 0)?;
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::d1()
    }
}

/// How a statement writes rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Insert,
    Update,
    Delete,
}

/// A schema object a statement creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SchemaObject {
    Table(String),
    View,
    Trigger,
    Index { index: String, table: String },
}

/// What the authorizer learned about the statement it last saw prepared.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct StatementFacts {
    /// How the statement itself writes, and to which table (triggers' writes not included).
    pub writes: Option<(WriteKind, String)>,
    /// Columns the statement itself updates.
    pub updated_columns: Vec<String>,
    /// What the statement creates in the schema, for counting the rows it writes there.
    pub creates: Option<SchemaObject>,
    /// Whether the statement creates, drops or alters schema objects.
    pub changes_schema: bool,
    /// Whether the statement is an ALTER TABLE, whose new name SQLite does not show us.
    pub alters_table: bool,
    /// Whether the statement tried BEGIN, COMMIT, ROLLBACK, SAVEPOINT or RELEASE.
    pub transaction: bool,
}

#[derive(Default)]
struct AuthState {
    /// kura's own statements (BEGIN, savepoints, size queries) bypass the rules.
    internal: bool,
    facts: StatementFacts,
}

/// The authorizer's shared state: the connection's closure and the executor both hold it.
#[derive(Clone, Default)]
pub(crate) struct Authorizer {
    state: Arc<Mutex<AuthState>>,
}

impl Authorizer {
    fn lock(&self) -> MutexGuard<'_, AuthState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Installs the authorizer on a connection.
    pub(crate) fn install(&self, conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
        let me = self.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| me.authorize(ctx)))
    }

    /// Runs `f` with the rules off, for kura's own statements.
    pub(crate) fn internal<T>(&self, f: impl FnOnce() -> T) -> T {
        let previous = std::mem::replace(&mut self.lock().internal, true);
        let out = f();
        self.lock().internal = previous;
        out
    }

    /// Forgets the facts of the previous statement.
    pub(crate) fn reset_facts(&self) {
        self.lock().facts = StatementFacts::default();
    }

    /// The facts gathered since the last reset.
    pub(crate) fn take_facts(&self) -> StatementFacts {
        std::mem::take(&mut self.lock().facts)
    }

    fn authorize(&self, ctx: AuthContext<'_>) -> Authorization {
        let mut state = self.lock();
        if state.internal {
            return Authorization::Allow;
        }
        let top_level = ctx.accessor.is_none();
        let verdict = decide(&ctx, &mut state.facts, top_level);
        if verdict == Authorization::Deny {
            tracing::debug!(action = ?ctx.action, "authorizer denied")
        }
        verdict
    }
}

fn allow_if(ok: bool) -> Authorization {
    if ok { Authorization::Allow } else { Authorization::Deny }
}

/// Names starting with `_cf_` (any case) are reserved for the platform.
pub(crate) fn is_reserved_name(name: &str) -> bool {
    name.len() >= 4 && name.as_bytes()[..4].eq_ignore_ascii_case(b"_cf_")
}

/// SQLite's raw page and storage views, which D1 does not offer.
fn is_raw_storage(name: &str) -> bool {
    name.eq_ignore_ascii_case("sqlite_dbpage") || name.eq_ignore_ascii_case("dbstat")
}

fn in_main(db: Option<&str>) -> bool {
    matches!(db, None | Some("main"))
}

fn decide(ctx: &AuthContext<'_>, facts: &mut StatementFacts, top_level: bool) -> Authorization {
    let db = ctx.database_name;
    match ctx.action {
        AuthAction::Select | AuthAction::Recursive => Authorization::Allow,
        AuthAction::Read { table_name, .. } => allow_if(
            !is_reserved_name(table_name) && !is_raw_storage(table_name) && (in_main(db) || db == Some("temp")),
        ),
        AuthAction::Insert { table_name } => {
            if top_level && facts.writes.is_none() {
                facts.writes = Some((WriteKind::Insert, table_name.to_owned()));
            }
            allow_if(!is_reserved_name(table_name) && !is_raw_storage(table_name) && in_main(db))
        }
        AuthAction::Delete { table_name } => {
            if top_level && facts.writes.is_none() {
                facts.writes = Some((WriteKind::Delete, table_name.to_owned()));
            }
            allow_if(!is_reserved_name(table_name) && !is_raw_storage(table_name) && in_main(db))
        }
        AuthAction::Update { table_name, column_name } => {
            if top_level {
                if facts.writes.is_none() {
                    facts.writes = Some((WriteKind::Update, table_name.to_owned()));
                }
                if facts.writes.as_ref().is_some_and(|(_, t)| t == table_name) {
                    facts.updated_columns.push(column_name.to_owned());
                }
            }
            allow_if(
                !is_reserved_name(table_name) && !is_raw_storage(table_name) && (in_main(db) || db == Some("temp")),
            )
        }
        AuthAction::CreateTable { table_name } => {
            facts.changes_schema = true;
            facts.creates = Some(SchemaObject::Table(table_name.to_owned()));
            allow_if(!is_reserved_name(table_name) && in_main(db))
        }
        AuthAction::CreateIndex { index_name, table_name } => {
            facts.changes_schema = true;
            // CREATE TABLE also creates the indexes of its constraints; those count with it.
            if facts.creates.is_none() {
                facts.creates =
                    Some(SchemaObject::Index { index: index_name.to_owned(), table: table_name.to_owned() });
            }
            allow_if(!is_reserved_name(index_name) && !is_reserved_name(table_name) && in_main(db))
        }
        AuthAction::CreateTrigger { trigger_name, table_name } => {
            facts.changes_schema = true;
            facts.creates = Some(SchemaObject::Trigger);
            allow_if(!is_reserved_name(trigger_name) && !is_reserved_name(table_name) && in_main(db))
        }
        AuthAction::CreateView { view_name } => {
            facts.creates = Some(SchemaObject::View);
            facts.changes_schema = true;
            allow_if(!is_reserved_name(view_name) && in_main(db))
        }
        AuthAction::DropTable { table_name } => {
            facts.changes_schema = true;
            allow_if(!is_reserved_name(table_name) && in_main(db))
        }
        AuthAction::DropIndex { index_name, table_name } => {
            facts.changes_schema = true;
            allow_if(!is_reserved_name(index_name) && !is_reserved_name(table_name) && in_main(db))
        }
        AuthAction::DropTrigger { trigger_name, table_name } => {
            facts.changes_schema = true;
            allow_if(!is_reserved_name(trigger_name) && !is_reserved_name(table_name) && in_main(db))
        }
        AuthAction::DropView { view_name } => {
            facts.changes_schema = true;
            allow_if(!is_reserved_name(view_name) && in_main(db))
        }
        // ALTER names its schema in the action itself; the context's last argument is the new
        // column name for RENAME COLUMN, not a schema.
        AuthAction::AlterTable { database_name, table_name } => {
            facts.changes_schema = true;
            facts.alters_table = true;
            allow_if(!is_reserved_name(table_name) && in_main(Some(database_name)))
        }
        AuthAction::Reindex { index_name } => allow_if(!is_reserved_name(index_name)),
        AuthAction::Analyze { .. } => Authorization::Allow,
        AuthAction::CreateVtable { table_name, module_name } => {
            facts.changes_schema = true;
            allow_if(!is_reserved_name(table_name) && in_main(db) && is_allowed_module(module_name))
        }
        AuthAction::DropVtable { table_name, module_name } => {
            facts.changes_schema = true;
            allow_if(!is_reserved_name(table_name) && in_main(db) && is_allowed_module(module_name))
        }
        AuthAction::Function { function_name } => allow_if(is_allowed_function(function_name)),
        AuthAction::Pragma { pragma_name, pragma_value } => {
            allow_if(in_main(db) && is_allowed_pragma(pragma_name, pragma_value))
        }
        AuthAction::Transaction { .. } => {
            facts.transaction = true;
            Authorization::Deny
        }
        AuthAction::Savepoint { .. } => {
            facts.transaction = true;
            Authorization::Deny
        }
        // ATTACH, DETACH, TEMP objects and anything SQLite adds later.
        _ => Authorization::Deny,
    }
}

fn is_allowed_module(module: &str) -> bool {
    ["fts5", "fts5vocab", "rtree", "rtree_i32"].iter().any(|m| m.eq_ignore_ascii_case(module))
}

/// SQL functions user SQL may call (D1's documented SQL functions): SQLite's core, date and time,
/// aggregate, window, math, JSON and FTS5 functions, and the internals ALTER TABLE uses.
const ALLOWED_FUNCTIONS: &[&str] = &[
    // core scalar
    "abs",
    "changes",
    "char",
    "coalesce",
    "concat",
    "concat_ws",
    "format",
    "glob",
    "hex",
    "ifnull",
    "iif",
    "if",
    "instr",
    "last_insert_rowid",
    "length",
    "like",
    "likelihood",
    "likely",
    "lower",
    "ltrim",
    "max",
    "min",
    "nullif",
    "octet_length",
    "printf",
    "quote",
    "random",
    "randomblob",
    "replace",
    "round",
    "rtrim",
    "sign",
    "soundex",
    "substr",
    "substring",
    "total_changes",
    "trim",
    "typeof",
    "unhex",
    "unicode",
    "unlikely",
    "upper",
    "zeroblob",
    // date and time
    "date",
    "time",
    "datetime",
    "julianday",
    "unixepoch",
    "strftime",
    "timediff",
    "current_date",
    "current_time",
    "current_timestamp",
    // aggregate
    "avg",
    "count",
    "group_concat",
    "string_agg",
    "sum",
    "total",
    // window
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    // math
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "ceil",
    "ceiling",
    "cos",
    "cosh",
    "degrees",
    "exp",
    "floor",
    "ln",
    "log",
    "log10",
    "log2",
    "mod",
    "pi",
    "pow",
    "power",
    "radians",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    // JSON and JSONB
    "json",
    "jsonb",
    "json_array",
    "jsonb_array",
    "json_array_length",
    "json_error_position",
    "json_extract",
    "jsonb_extract",
    "->",
    "->>",
    "json_insert",
    "jsonb_insert",
    "json_object",
    "jsonb_object",
    "json_patch",
    "jsonb_patch",
    "json_pretty",
    "json_remove",
    "jsonb_remove",
    "json_replace",
    "jsonb_replace",
    "json_set",
    "jsonb_set",
    "json_type",
    "json_valid",
    "json_quote",
    "json_group_array",
    "jsonb_group_array",
    "json_group_object",
    "jsonb_group_object",
    "json_each",
    "jsonb_each",
    "json_tree",
    "jsonb_tree",
    // FTS5 and R*Tree
    "match",
    "highlight",
    "bm25",
    "snippet",
    "rtreecheck",
    // what ALTER TABLE runs internally
    "sqlite_rename_column",
    "sqlite_rename_table",
    "sqlite_rename_test",
    "sqlite_drop_column",
    "sqlite_rename_quotefix",
];

fn is_allowed_function(name: &str) -> bool {
    ALLOWED_FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(name))
}

fn unquote(value: &str) -> &str {
    let v = value.trim();
    for q in ['\'', '"', '`'] {
        if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
            return &v[1..v.len() - 1];
        }
    }
    if v.len() >= 2 && v.starts_with('[') && v.ends_with(']') {
        return &v[1..v.len() - 1];
    }
    v
}

fn is_boolean(value: &str) -> bool {
    ["true", "false", "yes", "no", "on", "off", "1", "0"].iter().any(|b| b.eq_ignore_ascii_case(unquote(value)))
}

fn is_object_name(value: &str) -> bool {
    let name = unquote(value);
    !name.is_empty() && !is_reserved_name(name)
}

/// D1's PRAGMA allow-list with its argument rules.
fn is_allowed_pragma(name: &str, value: Option<&str>) -> bool {
    let name = name.to_ascii_lowercase();
    match name.as_str() {
        "table_list" => true,
        "data_version" | "page_size" => value.is_none(),
        "case_sensitive_like"
        | "foreign_keys"
        | "defer_foreign_keys"
        | "ignore_check_constraints"
        | "legacy_alter_table"
        | "recursive_triggers"
        | "reverse_unordered_selects" => value.is_none_or(is_boolean),
        "table_info" | "table_xinfo" | "foreign_key_list" | "index_info" | "index_list" | "index_xinfo" => {
            value.is_some_and(is_object_name)
        }
        "foreign_key_check" => value.is_none_or(is_object_name),
        "quick_check" => value.is_none_or(|v| unquote(v).parse::<u32>().is_ok() || is_object_name(v)),
        "optimize" => value.is_none_or(|v| {
            unquote(v).parse::<i64>().is_ok_and(|n| i32::try_from(n).is_ok() || u32::try_from(n).is_ok())
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_cf_names_in_any_case() {
        assert!(is_reserved_name("_cf_KV"));
        assert!(is_reserved_name("_CF_anything"));
        assert!(!is_reserved_name("_cf"));
        assert!(!is_reserved_name("cf_table"));
    }

    #[test]
    fn pragma_rules_follow_d1() {
        assert!(is_allowed_pragma("table_list", None));
        assert!(is_allowed_pragma("TABLE_INFO", Some("users")));
        assert!(!is_allowed_pragma("table_info", Some("_cf_KV")));
        assert!(!is_allowed_pragma("table_info", None));
        assert!(is_allowed_pragma("foreign_keys", Some("'ON'")));
        assert!(!is_allowed_pragma("foreign_keys", Some("maybe")));
        assert!(is_allowed_pragma("page_size", None));
        assert!(!is_allowed_pragma("page_size", Some("8192")));
        assert!(!is_allowed_pragma("user_version", None));
        assert!(!is_allowed_pragma("journal_mode", Some("delete")));
        assert!(is_allowed_pragma("quick_check", Some("10")));
        assert!(is_allowed_pragma("optimize", Some("0x10002").map(|_| "65538")));
    }

    #[test]
    fn functions_are_allow_listed() {
        assert!(is_allowed_function("json_extract"));
        assert!(is_allowed_function("COUNT"));
        assert!(!is_allowed_function("sqlite_version"));
        assert!(!is_allowed_function("unistr"));
    }
}
