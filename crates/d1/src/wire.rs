//! D1's JSON formats: parameters in (JSON numbers, strings, byte arrays), results out (rows as
//! objects or as columns + arrays, BLOBs as arrays of numbers) and `meta`.

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct, Serializer};

use kura_catalog::D1Database;
use kura_sqlite::{Bookmark, Meta, Restored, StatementResult, Value};
use serde_json::{Map, json};

use crate::DatabaseDetails;
use crate::import::ImportOutcome;

/// Who answered, as D1's `meta.served_by` says it.
pub const SERVED_BY: &str = "kura";

/// Converts a JSON parameter as D1 does: integers bind as INTEGER, other numbers as REAL,
/// booleans as 1/0, strings as TEXT, null as NULL, arrays of bytes (0..=255) as BLOB.
pub fn param_from_json(value: &serde_json::Value) -> Result<Value, String> {
    use serde_json::Value as J;
    Ok(match value {
        J::Null => Value::Null,
        J::Bool(b) => Value::Integer(i64::from(*b)),
        J::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::Text(s.clone()),
        J::Array(items) => {
            let bytes: Option<Vec<u8>> = items.iter().map(|i| i.as_u64().and_then(|b| u8::try_from(b).ok())).collect();
            bytes.map(Value::Blob).ok_or_else(|| type_error("object", value))?
        }
        J::Object(_) => return Err(type_error("object", value)),
    })
}

fn type_error(kind: &str, value: &serde_json::Value) -> String {
    let mut shown = value.to_string();
    if shown.len() > 100 {
        // At a character's boundary: a value's text may be any Unicode.
        let cut = (0..=100).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    format!("D1_TYPE_ERROR: Type '{kind}' not supported for value '{shown}'")
}

/// A `params` array deserialized straight into SQLite values (no intermediate JSON tree), with
/// [`param_from_json`]'s rules; `null` means no parameters.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct JsonParams(pub Vec<Value>);

/// One parameter, deserialized with [`param_from_json`]'s rules.
struct JsonParam(Value);

impl<'de> serde::Deserialize<'de> for JsonParam {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = JsonParam;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number, string, boolean, null or array of bytes")
            }
            fn visit_unit<E>(self) -> Result<JsonParam, E> {
                Ok(JsonParam(Value::Null))
            }
            fn visit_bool<E>(self, b: bool) -> Result<JsonParam, E> {
                Ok(JsonParam(Value::Integer(i64::from(b))))
            }
            fn visit_i64<E>(self, n: i64) -> Result<JsonParam, E> {
                Ok(JsonParam(Value::Integer(n)))
            }
            fn visit_u64<E>(self, n: u64) -> Result<JsonParam, E> {
                Ok(JsonParam(i64::try_from(n).map_or(Value::Real(n as f64), Value::Integer)))
            }
            fn visit_f64<E>(self, x: f64) -> Result<JsonParam, E> {
                Ok(JsonParam(Value::Real(x)))
            }
            fn visit_str<E>(self, s: &str) -> Result<JsonParam, E> {
                Ok(JsonParam(Value::Text(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<JsonParam, E> {
                Ok(JsonParam(Value::Text(s)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<JsonParam, A::Error> {
                // Bytes straight into a Vec<u8>: a JSON tree would take ~30 times the memory.
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                let mut all_bytes = true;
                while let Some(MaybeByte(byte)) = seq.next_element()? {
                    match byte {
                        Some(b) if all_bytes => bytes.push(b),
                        _ => all_bytes = false,
                    }
                }
                if !all_bytes {
                    return Err(serde::de::Error::custom(
                        "D1_TYPE_ERROR: Type 'object' not supported for value: an array parameter must hold bytes (0 to 255)",
                    ));
                }
                Ok(JsonParam(Value::Blob(bytes)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<JsonParam, A::Error> {
                let mut object = serde_json::Map::new();
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    object.insert(k, v);
                }
                param_from_json(&serde_json::Value::Object(object)).map(JsonParam).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(Visit)
    }
}

/// An array element: a byte, or anything else (consumed and reported as `None`).
struct MaybeByte(Option<u8>);

impl<'de> serde::Deserialize<'de> for MaybeByte {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = MaybeByte;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte")
            }
            fn visit_u64<E>(self, n: u64) -> Result<MaybeByte, E> {
                Ok(MaybeByte(u8::try_from(n).ok()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<MaybeByte, E> {
                Ok(MaybeByte(u8::try_from(n).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<MaybeByte, E> {
                Ok(MaybeByte(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<MaybeByte, E> {
                Ok(MaybeByte(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<MaybeByte, E> {
                Ok(MaybeByte(None))
            }
            fn visit_unit<E>(self) -> Result<MaybeByte, E> {
                Ok(MaybeByte(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<MaybeByte, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(MaybeByte(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<MaybeByte, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(MaybeByte(None))
            }
        }
        d.deserialize_any(Visit)
    }
}

impl<'de> serde::Deserialize<'de> for JsonParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let items: Option<Vec<JsonParam>> = serde::Deserialize::deserialize(d)?;
        Ok(JsonParams(items.unwrap_or_default().into_iter().map(|p| p.0).collect()))
    }
}

/// One value as D1 writes it: numbers as JavaScript would print them, BLOBs as byte arrays.
pub struct JsonValue<'a>(pub &'a Value);

impl Serialize for JsonValue<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit(),
            Value::Integer(i) => s.serialize_i64(*i),
            // JavaScript prints integral doubles without ".0"; JSON has no NaN or Infinity.
            Value::Real(x) if !x.is_finite() => s.serialize_unit(),
            Value::Real(x) if x.fract() == 0.0 && x.abs() < 9.0e18 => s.serialize_i64(*x as i64),
            Value::Real(x) => s.serialize_f64(*x),
            Value::Text(t) => s.serialize_str(t),
            Value::Blob(b) => {
                let mut seq = s.serialize_seq(Some(b.len()))?;
                for byte in b {
                    seq.serialize_element(byte)?;
                }
                seq.end()
            }
        }
    }
}

/// A row as an object. Duplicate column names keep their first position and the last value,
/// as JavaScript's `Object.fromEntries` does.
struct RowObject<'a> {
    columns: &'a [String],
    /// For each distinct column, in first-seen order, the index of its last occurrence.
    picks: &'a [(usize, usize)],
    row: &'a [Value],
}

impl Serialize for RowObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.picks.len()))?;
        for &(name_at, value_at) in self.picks {
            map.serialize_entry(&self.columns[name_at], &JsonValue(&self.row[value_at]))?;
        }
        map.end()
    }
}

fn column_picks(columns: &[String]) -> Vec<(usize, usize)> {
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(columns.len());
    for (i, name) in columns.iter().enumerate() {
        match picks.iter_mut().find(|(first, _)| columns[*first] == *name) {
            Some(pick) => pick.1 = i,
            None => picks.push((i, i)),
        }
    }
    picks
}

/// Rows as an array of objects (D1's `ARRAY_OF_OBJECTS`, REST `/query`).
pub struct RowObjects<'a>(pub &'a StatementResult);

impl Serialize for RowObjects<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let picks = column_picks(&self.0.columns);
        let mut seq = s.serialize_seq(Some(self.0.rows.len()))?;
        for row in &self.0.rows {
            seq.serialize_element(&RowObject { columns: &self.0.columns, picks: &picks, row })?;
        }
        seq.end()
    }
}

/// Rows as `{"columns": [...], "rows": [[...]]}` (D1's `ROWS_AND_COLUMNS`, REST `/raw`).
pub struct RowsAndColumns<'a>(pub &'a StatementResult);

struct JsonRow<'a>(&'a [Value]);

impl Serialize for JsonRow<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for v in self.0 {
            seq.serialize_element(&JsonValue(v))?;
        }
        seq.end()
    }
}

/// Rows as arrays of values.
pub struct JsonRows<'a>(pub &'a [Vec<Value>]);

impl Serialize for JsonRows<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for row in self.0 {
            seq.serialize_element(&JsonRow(row))?;
        }
        seq.end()
    }
}

impl Serialize for RowsAndColumns<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_struct("RowsAndColumns", 2)?;
        out.serialize_field("columns", &self.0.columns)?;
        out.serialize_field("rows", &JsonRows(&self.0.rows))?;
        out.end()
    }
}

/// Which copy of a database answered, as D1's `meta` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedBy<'a> {
    /// The database's owner (`served_by_primary`), or a read replica.
    pub primary: bool,
    /// The node that answered (`served_by_region`), in a cluster.
    pub region: Option<&'a str>,
}

impl ServedBy<'_> {
    /// The one copy a single node keeps.
    pub const PRIMARY: ServedBy<'static> = ServedBy { primary: true, region: None };
}

/// D1's `meta` object, and which copy answered.
pub struct JsonMeta<'a>(pub &'a Meta, pub ServedBy<'a>);

#[derive(Serialize)]
struct Timings {
    sql_duration_ms: f64,
}

impl Serialize for JsonMeta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (m, served_by) = (self.0, self.1);
        let mut out = s.serialize_struct("Meta", 11)?;
        out.serialize_field("served_by", SERVED_BY)?;
        out.serialize_field("served_by_primary", &served_by.primary)?;
        if let Some(region) = served_by.region {
            out.serialize_field("served_by_region", region)?;
        }
        out.serialize_field("timings", &Timings { sql_duration_ms: m.duration_ms })?;
        out.serialize_field("duration", &m.duration_ms)?;
        out.serialize_field("changes", &m.changes)?;
        out.serialize_field("last_row_id", &m.last_row_id)?;
        out.serialize_field("changed_db", &m.changed_db)?;
        out.serialize_field("size_after", &m.size_after)?;
        out.serialize_field("rows_read", &m.rows_read)?;
        out.serialize_field("rows_written", &m.rows_written)?;
        out.end()
    }
}

/// How rows are shaped in a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    /// An array of objects.
    Objects,
    /// Columns plus arrays.
    Raw,
}

/// One statement's result as D1's REST API returns it: `{results, success, meta}`.
pub struct JsonResult<'a> {
    /// The result.
    pub result: &'a StatementResult,
    /// How to shape its rows.
    pub format: RowFormat,
    /// Which copy answered.
    pub served_by: ServedBy<'a>,
}

impl Serialize for JsonResult<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_struct("Result", 3)?;
        match self.format {
            RowFormat::Objects => out.serialize_field("results", &RowObjects(self.result))?,
            RowFormat::Raw => out.serialize_field("results", &RowsAndColumns(self.result))?,
        }
        out.serialize_field("success", &true)?;
        out.serialize_field("meta", &JsonMeta(&self.result.meta, self.served_by))?;
        out.end()
    }
}

/// All results of a request.
pub struct JsonResults<'a> {
    /// The results, one per statement.
    pub results: &'a [StatementResult],
    /// How to shape their rows.
    pub format: RowFormat,
    /// Which copy answered.
    pub served_by: ServedBy<'a>,
}

impl Serialize for JsonResults<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.results.len()))?;
        for result in self.results {
            seq.serialize_element(&JsonResult { result, format: self.format, served_by: self.served_by })?;
        }
        seq.end()
    }
}

/// A database as `GET /d1/database` lists it.
pub fn database_list_item(db: &D1Database) -> serde_json::Value {
    json!({
        "uuid": db.uuid,
        "name": db.name,
        "created_at": db.created_at,
        "version": "production",
        "jurisdiction": db.jurisdiction,
    })
}

/// A database as `POST /d1/database` returns it.
pub fn created_database(db: &D1Database) -> serde_json::Value {
    let mut result = database_list_item(db);
    if let Some(hint) = &db.primary_location_hint {
        result["primary_location_hint"] = json!(hint);
        result["created_in_region"] = json!(hint.to_uppercase());
    }
    result
}

/// A restore's answer: the restored state's bookmark and the one before it (restoring which
/// undoes this restore).
pub fn restored(restored: &Restored) -> serde_json::Value {
    json!({
        "bookmark": restored.bookmark.to_string(),
        "previous_bookmark": restored.previous.to_string(),
        "message": "Database restored successfully",
    })
}

/// A finished import's result, as wrangler reads it: the bookmark after it, the statements it
/// ran and their counters.
pub fn imported(outcome: &ImportOutcome, bookmark: &Bookmark) -> serde_json::Value {
    json!({
        "final_bookmark": bookmark.to_string(),
        "num_queries": outcome.num_queries,
        "meta": JsonMeta(&outcome.meta, ServedBy::PRIMARY),
    })
}

/// A database as `GET /d1/database/{id}` describes it.
pub fn database_details(details: &DatabaseDetails) -> Map<String, serde_json::Value> {
    let db = &details.database;
    let mut out = Map::new();
    out.insert("uuid".into(), json!(db.uuid));
    out.insert("name".into(), json!(db.name));
    out.insert("created_at".into(), json!(db.created_at));
    out.insert("version".into(), json!("production"));
    out.insert("num_tables".into(), json!(details.num_tables));
    out.insert("file_size".into(), json!(details.file_size));
    if let Some(hint) = &db.primary_location_hint {
        out.insert("running_in_region".into(), json!(hint.to_uppercase()));
    }
    out.insert("read_replication".into(), json!({ "mode": db.read_replication }));
    out.insert("jurisdiction".into(), json!(db.jurisdiction));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the API fuzz test: a refused parameter whose text is cut for the message at a
    /// byte inside a character panicked the request's task.
    #[test]
    fn a_long_unicode_value_in_a_type_error_is_cut_at_a_character() {
        // `{"k":"a` is 7 bytes, so byte 100 falls inside an `é`.
        let value = serde_json::json!({ "k": format!("a{}", "é".repeat(80)) });
        let message = type_error("object", &value);
        assert!(message.starts_with("D1_TYPE_ERROR: Type 'object' not supported for value '{\"k\":\"aé"), "{message}");
        assert!(message.ends_with("…'"), "{message}");
    }
    use serde_json::json;

    fn result(columns: &[&str], rows: Vec<Vec<Value>>) -> StatementResult {
        StatementResult { columns: columns.iter().map(|c| c.to_string()).collect(), rows, meta: Meta::default() }
    }

    #[test]
    fn params_bind_like_d1() {
        let p: Vec<Value> = [json!(1), json!(1.5), json!("x"), json!(null), json!(true), json!([1, 255]), json!([])]
            .iter()
            .map(|v| param_from_json(v).unwrap())
            .collect();
        assert_eq!(
            p,
            vec![
                Value::Integer(1),
                Value::Real(1.5),
                Value::Text("x".into()),
                Value::Null,
                Value::Integer(1),
                Value::Blob(vec![1, 255]),
                Value::Blob(vec![])
            ]
        );
        assert!(param_from_json(&json!({"a": 1})).unwrap_err().starts_with("D1_TYPE_ERROR: Type 'object'"));
        assert!(param_from_json(&json!([1, 256])).is_err());
        assert!(param_from_json(&json!(["a"])).is_err());
    }

    #[test]
    fn params_deserialize_straight_into_values() {
        let p: JsonParams =
            serde_json::from_str(r#"[1, 1.5, "x", null, false, [7, 8], 18446744073709551615]"#).unwrap();
        assert_eq!(
            p.0,
            vec![
                Value::Integer(1),
                Value::Real(1.5),
                Value::Text("x".into()),
                Value::Null,
                Value::Integer(0),
                Value::Blob(vec![7, 8]),
                Value::Real(18446744073709551615.0)
            ]
        );
        let none: JsonParams = serde_json::from_str("null").unwrap();
        assert!(none.0.is_empty());
        let e = serde_json::from_str::<JsonParams>(r#"[{"a": 1}]"#).unwrap_err().to_string();
        assert!(e.starts_with("D1_TYPE_ERROR: Type 'object' not supported"), "{e}");
        assert!(serde_json::from_str::<JsonParams>(r#"[[1, 999]]"#).is_err());
        assert!(serde_json::from_str::<JsonParams>(r#"[[1, "a", {"b": [2]}]]"#).is_err());
        let empty: JsonParams = serde_json::from_str("[[]]").unwrap();
        assert_eq!(empty.0, vec![Value::Blob(vec![])]);
        assert!(serde_json::from_str::<JsonParams>(r#"{"a": 1}"#).is_err());
    }

    #[test]
    fn values_print_as_javascript_would() {
        let r = result(
            &["i", "r", "whole", "t", "b", "n", "inf"],
            vec![vec![
                Value::Integer(9007199254740993),
                Value::Real(1.5),
                Value::Real(2.0),
                Value::Text("é".into()),
                Value::Blob(vec![0, 7]),
                Value::Null,
                Value::Real(f64::INFINITY),
            ]],
        );
        let json = serde_json::to_string(&RowObjects(&r)).unwrap();
        assert_eq!(json, r#"[{"i":9007199254740993,"r":1.5,"whole":2,"t":"é","b":[0,7],"n":null,"inf":null}]"#);
    }

    #[test]
    fn duplicate_columns_keep_the_last_value() {
        let r = result(&["a", "c", "c"], vec![vec![Value::Integer(1), Value::Integer(2), Value::Integer(3)]]);
        assert_eq!(serde_json::to_string(&RowObjects(&r)).unwrap(), r#"[{"a":1,"c":3}]"#);
        assert_eq!(
            serde_json::to_string(&RowsAndColumns(&r)).unwrap(),
            r#"{"columns":["a","c","c"],"rows":[[1,2,3]]}"#
        );
    }
}
