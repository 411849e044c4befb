//! Small helpers shared by the three protocol translators: typed reads of `serde_json::Value` fields with 400s that name the field.

use serde_json::{Map, Value};

use crate::error::GatewayError;

/// A string field of an upstream's JSON, or "" when absent or not a string (replies are read
/// leniently: an odd field must not fail the whole answer).
pub fn str_at(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

pub fn get_str<'v>(v: &'v Value, key: &str, path: &str) -> Result<Option<&'v str>, GatewayError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(GatewayError::invalid(
            path,
            format!("`{path}` must be a string"),
        )),
    }
}

pub fn req_str<'v>(v: &'v Value, key: &str, path: &str) -> Result<&'v str, GatewayError> {
    get_str(v, key, path)?
        .ok_or_else(|| GatewayError::invalid(path, format!("`{path}` is required")))
}

pub fn get_bool(v: &Value, key: &str, path: &str) -> Result<Option<bool>, GatewayError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(GatewayError::invalid(
            path,
            format!("`{path}` must be a boolean"),
        )),
    }
}

pub fn get_f64_in(v: &Value, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, GatewayError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if (lo..=hi).contains(&x) {
                Ok(Some(x))
            } else {
                Err(GatewayError::invalid(
                    key,
                    format!("`{key}` must be between {lo} and {hi}; got {x}"),
                ))
            }
        }
        Some(_) => Err(GatewayError::invalid(
            key,
            format!("`{key}` must be a number"),
        )),
    }
}

pub fn get_u64(v: &Value, key: &str, min: u64) -> Result<Option<u64>, GatewayError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(x) if x >= min => Ok(Some(x)),
            _ => Err(GatewayError::invalid(
                key,
                format!("`{key}` must be an integer of at least {min}; got {n}"),
            )),
        },
        Some(_) => Err(GatewayError::invalid(
            key,
            format!("`{key}` must be an integer"),
        )),
    }
}

pub fn get_array<'v>(
    v: &'v Value,
    key: &str,
    path: &str,
) -> Result<Option<&'v Vec<Value>>, GatewayError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(GatewayError::invalid(
            path,
            format!("`{path}` must be an array"),
        )),
    }
}

pub fn as_object<'v>(v: &'v Value, path: &str) -> Result<&'v Map<String, Value>, GatewayError> {
    v.as_object()
        .ok_or_else(|| GatewayError::invalid(path, format!("`{path}` must be an object")))
}

/// The string list of a `stop`-like field: a string or an array of strings.
pub fn string_list(v: &Value, key: &str) -> Result<Vec<String>, GatewayError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str().map(str::to_owned).ok_or_else(|| {
                    GatewayError::invalid(
                        format!("{key}[{i}]"),
                        format!("`{key}[{i}]` must be a string"),
                    )
                })
            })
            .collect(),
        Some(_) => Err(GatewayError::invalid(
            key,
            format!("`{key}` must be a string or an array of strings"),
        )),
    }
}

/// A refusal for a field that cannot cross to another protocol.
pub fn unsupported(param: &str, why: &str) -> GatewayError {
    GatewayError::invalid(
        param,
        format!("`{param}` cannot be translated for this model's upstream: {why}"),
    )
}

/// Re-prefixes an upstream id for the client's protocol (`msg_01A` → `chatcmpl-01A`), so ids
/// stay traceable across the translation and deterministic for the same upstream reply.
pub fn reprefix(id: &str, prefix: &str) -> String {
    if id.starts_with(prefix) {
        return id.to_owned();
    }
    let bare = ["chatcmpl-", "msg_", "resp_"]
        .iter()
        .find_map(|p| id.strip_prefix(p))
        .unwrap_or(id);
    if bare.is_empty() {
        return crate::ir::mint_id(prefix);
    }
    format!("{prefix}{bare}")
}
