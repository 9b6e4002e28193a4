//! How the CLI prints: tables for people, JSON for scripts, errors with their causes.

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde_json::Value as Json;

/// A table with a header row.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    t.to_string()
}

/// A JSON value as a table cell: strings bare, everything else as JSON.
pub fn cell(value: &Json) -> String {
    match value {
        Json::String(s) => s.clone(),
        Json::Null => "null".into(),
        other => other.to_string(),
    }
}

/// Rows (objects) as a table, columns in the first row's key order.
pub fn objects_table(rows: &[Json]) -> String {
    let Some(Json::Object(first)) = rows.first() else { return String::new() };
    let header: Vec<String> = first.keys().cloned().collect();
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let body =
        rows.iter().map(|row| header.iter().map(|k| row.get(k).map(cell).unwrap_or_default()).collect()).collect();
    table(&header_refs, body)
}

/// Pretty JSON on stdout.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("cannot print JSON: {e}"),
    }
}

/// An error and its causes on one line.
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}
