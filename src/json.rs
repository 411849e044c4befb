//! A top-level JSON object kept as raw values, so the gateway edits a few keys and forwards the rest byte for byte.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

pub mod scan;
pub mod walk;
pub mod write;

/// What a field's value was expected to be; renders into "expected …" messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    String,
    Bool,
    Number,
    Integer,
    Object,
    Array,
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::String => "a string",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::Integer => "an integer",
            Self::Object => "an object",
            Self::Array => "an array",
        })
    }
}

/// A JSON object whose values stay unparsed until a caller asks for one.
///
/// Key order is kept, and a repeated key keeps only its last value (as serde_json's `Value`
/// does), so what the gateway validates is exactly what the upstream receives.
#[derive(Debug, Default, Clone)]
pub struct RawObject<'a> {
    /// Keys unescaped; values as their JSON text, each known to be valid JSON.
    entries: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// [`key_bit`] of every key in `entries` (and of keys since removed): most lookups are of
    /// optional fields a body does not have, and this answers them without comparing a key.
    keys: u64,
}

/// One of 64 bits for `key`, from its length and its first and last bytes; keys that share a
/// bit are told apart by comparing them.
fn key_bit(key: &str) -> u64 {
    let b = key.as_bytes();
    let (first, last) = match b {
        [] => (0, 0),
        [one] => (*one, *one),
        [first, .., last] => (*first, *last),
    };
    let h = (b.len() as u32)
        .wrapping_mul(7)
        .wrapping_add(u32::from(first).wrapping_mul(3))
        .wrapping_add(u32::from(last));
    1 << (h % 64)
}

/// The text of one JSON value known to be valid: read out of a body that was checked whole, or
/// out of serde's own `RawValue`. Only this module makes one, so the typed reads below can walk
/// it without checking it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub fn get(self) -> &'a str {
        self.0
    }
}

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(raw: &'a RawValue) -> Self {
        Self(raw.get())
    }
}

impl<'a> RawObject<'a> {
    fn new(entries: Vec<(Cow<'a, str>, Cow<'a, str>)>) -> Self {
        let keys = entries.iter().fold(0, |bits, (k, _)| bits | key_bit(k));
        Self { entries, keys }
    }

    /// Parses `bytes` as one JSON object.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, serde_json::Error> {
        // Checked as UTF-8 once, whole: read from a byte slice, serde checks each key and each
        // raw value again on its own. Invalid UTF-8 is read as bytes, for serde's error with
        // its line and column.
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::read(serde_json::Deserializer::from_str(text)),
            Err(_) => Self::read(serde_json::Deserializer::from_slice(bytes)),
        }
    }

    fn read<R: serde_json::de::Read<'a>>(
        mut de: serde_json::Deserializer<R>,
    ) -> Result<Self, serde_json::Error> {
        let obj = Self::deserialize(&mut de)?;
        de.end()?;
        Ok(obj)
    }

    /// Parses a raw value that must itself be an object.
    pub fn from_raw(raw: Raw<'a>) -> Option<Self> {
        if !raw.0.starts_with('{') {
            return None;
        }
        scan::object_in(raw.0).or_else(|| serde_json::from_str(raw.0).ok())
    }

    pub fn get(&self, key: &str) -> Option<Raw<'_>> {
        if self.keys & key_bit(key) == 0 {
            return None;
        }
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| Raw(v))
    }

    /// The value of `key`, treating JSON `null` as absent (as OpenAI's API does).
    pub fn get_present(&self, key: &str) -> Option<Raw<'_>> {
        self.get(key).filter(|v| v.0 != "null")
    }

    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Takes `key` out, answering its value's JSON text.
    pub fn remove(&mut self, key: &str) -> Option<Cow<'a, str>> {
        if self.keys & key_bit(key) == 0 {
            return None;
        }
        let pos = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(pos).1)
    }

    /// Replaces `key`'s value in place, or appends the key when it is absent.
    pub fn set(&mut self, key: &'a str, value: Box<RawValue>) {
        self.set_text(key, Cow::Owned(text_of(value)));
    }

    /// [`Self::set`] for the text of a value the caller wrote from checked JSON (the elements
    /// of an array, each read by a reader that checks what it reads): not checked again.
    pub fn set_text(&mut self, key: &'a str, text: Cow<'a, str>) {
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = text,
            None => {
                self.keys |= key_bit(key);
                self.entries.push((Cow::Borrowed(key), text));
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The members in order: each key unescaped, each value as its JSON text.
    pub fn members(&self) -> impl Iterator<Item = (&str, Raw<'_>)> {
        self.entries.iter().map(|(k, v)| (&**k, Raw(v)))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_ref())
    }

    /// Writes the object back out; untouched values are copied verbatim.
    pub fn to_vec(&self) -> Vec<u8> {
        let size: usize = self
            .entries
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum();
        let mut out = Vec::with_capacity(size + 2);
        out.push(b'{');
        for (i, (k, v)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_str(&mut out, k);
            out.push(b':');
            out.extend_from_slice(v.as_bytes());
        }
        out.push(b'}');
        out
    }

    pub fn to_raw(&self) -> Box<RawValue> {
        // The bytes come from valid raw values joined with valid keys, so this cannot fail;
        // fall back to an empty object rather than panic if that ever changes.
        let text = String::from_utf8(self.to_vec()).unwrap_or_else(|_| "{}".to_owned());
        RawValue::from_string(text).unwrap_or_else(|_| raw_literal("{}"))
    }
}

fn text_of(value: Box<RawValue>) -> String {
    String::from(Box::<str>::from(value))
}

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjVisitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for ObjVisitor<'a> {
            type Value = RawObject<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries: Vec<(Cow<'a, str>, Cow<'a, str>)> =
                    Vec::with_capacity(map.size_hint().unwrap_or(16));
                // Borrowed from the body unless escaped: serde's own `Cow<str>` always copies.
                while let Some(crate::translate::lax::Key(key)) = map.next_key()? {
                    let value: &'de RawValue = map.next_value()?;
                    if let Some(pos) = entries.iter().position(|(k, _)| *k == key) {
                        entries.remove(pos);
                    }
                    entries.push((key, Cow::Borrowed(value.get())));
                }
                Ok(RawObject::new(entries))
            }
        }

        deserializer.deserialize_map(ObjVisitor(std::marker::PhantomData))
    }
}

/// How deep a request body may nest; real requests (JSON schemas in tools included) stay far
/// below, and a fixed bound keeps every later parse of the body (the typed decoders, the
/// upstream's own parser) clear of recursion limits and stack exhaustion.
pub const MAX_DEPTH: usize = 64;

/// Why a request body was refused by [`check_structure`].
#[derive(Debug, PartialEq, Eq)]
pub enum BodyProblem {
    /// A key appears twice in one object; `path` names the second occurrence.
    RepeatedKey { path: String },
    /// Nested deeper than [`MAX_DEPTH`]; `path` names where the limit was reached.
    TooDeep { path: String },
}

/// Checks the structure of a body already known to be valid JSON, in one linear pass over its
/// bytes: no object with a repeated key at any depth, nesting within [`MAX_DEPTH`]. Parsers
/// disagree on a repeated key (first or last wins), so refusing it is the only way what the
/// gateway validates is what the upstream reads. Numbers and literals are skipped, never
/// parsed, so a value out of any parser's range is left to the field's own validation.
pub fn check_structure(bytes: &[u8]) -> Result<(), BodyProblem> {
    let mut stack: Vec<Level<'_>> = Vec::with_capacity(8);
    // The keys of every open object in one list, innermost object's last: one allocation for
    // the whole body instead of one per object.
    let mut keys: Vec<Key<'_>> = Vec::with_capacity(32);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let end = string_end(bytes, i + 1);
                if let Some(Level::Object {
                    first,
                    many,
                    current,
                    expecting_key: expecting @ true,
                }) = stack.last_mut()
                {
                    *expecting = false;
                    let key = Key::new(&bytes[i + 1..end]);
                    let known = keys.get(*first..).unwrap_or_default();
                    let fresh = match many {
                        Some(set) => set.insert(key),
                        None if known.contains(&key) => false,
                        None if known.len() < LINEAR_KEYS => {
                            keys.push(key);
                            true
                        }
                        // Past a few keys, a hash set, so many keys cannot make this quadratic.
                        None => {
                            let mut set: std::collections::HashSet<Key<'_>> =
                                known.iter().copied().collect();
                            set.insert(key);
                            *many = Some(set);
                            true
                        }
                    };
                    *current = Some(key);
                    if !fresh {
                        let path = render_path(&stack, Some(key));
                        return Err(BodyProblem::RepeatedKey { path });
                    }
                }
                i = end + 1;
                continue;
            }
            open @ (b'{' | b'[') => {
                if stack.len() >= MAX_DEPTH {
                    return Err(BodyProblem::TooDeep {
                        path: render_path(&stack, None),
                    });
                }
                stack.push(if open == b'{' {
                    Level::Object {
                        first: keys.len(),
                        many: None,
                        current: None,
                        expecting_key: true,
                    }
                } else {
                    Level::Array { index: 0 }
                });
            }
            b'}' | b']' => {
                if let Some(Level::Object { first, .. }) = stack.pop() {
                    keys.truncate(first);
                }
            }
            b',' => match stack.last_mut() {
                Some(Level::Array { index }) => *index += 1,
                Some(Level::Object { expecting_key, .. }) => *expecting_key = true,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// How many bytes of a string are looked at one by one before a vectorised search takes over:
/// most strings in a request are short keys and values, whose end a plain loop finds before the
/// search has set up.
const SHORT_STRING: usize = 24;

/// The index of the closing quote of a string whose contents start at `from`.
fn string_end(bytes: &[u8], mut from: usize) -> usize {
    let head = bytes.len().min(from.saturating_add(SHORT_STRING));
    while from < head {
        match bytes[from] {
            b'"' => return from,
            b'\\' => from += 2,
            _ => from += 1,
        }
    }
    while let Some(rel) = bytes
        .get(from..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        let at = from + rel;
        if bytes[at] == b'"' {
            return at;
        }
        from = at + 2;
    }
    bytes.len()
}

/// A key as written in the body; two spellings of one key (`"a"` and `"\u0061"`) compare equal.
#[derive(Debug, Clone, Copy)]
struct Key<'a> {
    raw: &'a [u8],
    /// Has a backslash: compared by its unescaped text, which is rare and slower.
    escaped: bool,
}

impl<'a> Key<'a> {
    fn new(raw: &'a [u8]) -> Self {
        Self {
            raw,
            // Keys are short: a plain loop, not a vectorised search that has to set up first.
            escaped: raw.contains(&b'\\'),
        }
    }

    /// The key's text as bytes: UTF-8, or WTF-8 for a key with a lone surrogate (`"\ud800"`),
    /// which is no Unicode text but which parsers still read as one code unit, whatever the
    /// case of its hex digits.
    fn text(&self) -> Cow<'a, [u8]> {
        if self.escaped {
            let mut quoted = Vec::with_capacity(self.raw.len() + 2);
            quoted.push(b'"');
            quoted.extend_from_slice(self.raw);
            quoted.push(b'"');
            let mut de = serde_json::Deserializer::from_slice(&quoted);
            if let Ok(bytes) = serde::Deserializer::deserialize_bytes(&mut de, Unescaped) {
                return Cow::Owned(bytes);
            }
        }
        Cow::Borrowed(self.raw)
    }
}

/// Reads a JSON string's unescaped bytes (serde_json writes a lone surrogate as WTF-8).
struct Unescaped;

impl Visitor<'_> for Unescaped {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON string")
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        if !self.escaped && !other.escaped {
            return self.raw == other.raw;
        }
        self.text() == other.text()
    }
}

impl Eq for Key<'_> {}

impl std::hash::Hash for Key<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.escaped {
            self.text().hash(state);
        } else {
            self.raw.hash(state);
        }
    }
}

/// Objects with more keys than this switch from a linear scan to a hash set, so a body of many
/// keys cannot make the check quadratic.
const LINEAR_KEYS: usize = 16;

#[derive(Debug)]
enum Level<'a> {
    Object {
        /// Where this object's keys start in the list of keys of all open objects.
        first: usize,
        /// All of its keys, once it has more than [`LINEAR_KEYS`].
        many: Option<std::collections::HashSet<Key<'a>>>,
        current: Option<Key<'a>>,
        expecting_key: bool,
    },
    Array {
        index: usize,
    },
}

/// `messages[1].content[0].type`: where in the body the scan stands, for the error.
fn render_path(stack: &[Level<'_>], last: Option<Key<'_>>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let key = |out: &mut String, k: Key<'_>| {
        if !out.is_empty() {
            out.push('.');
        }
        let text = k.text();
        if text.is_empty() {
            // The empty key, named so a refusal still says where.
            out.push_str("\"\"");
        } else {
            out.push_str(&String::from_utf8_lossy(&text));
        }
    };
    let depth = stack.len();
    for (n, level) in stack.iter().enumerate() {
        match level {
            // For a repeated key, the innermost object's previous key is not on the path.
            Level::Object { current, .. } if n + 1 < depth || last.is_none() => {
                if let Some(k) = current {
                    key(&mut out, *k);
                }
            }
            Level::Object { .. } => {}
            Level::Array { index } => {
                let _ = write!(out, "[{index}]");
            }
        }
    }
    if let Some(k) = last {
        key(&mut out, k);
    }
    out
}

/// The elements of `text`, an array already known to be valid JSON (a part of a body that was
/// parsed whole), found by brackets and quotes alone, without checking the text again; `None`
/// when it is not an array.
pub fn known_elements(text: &str) -> Option<KnownElements<'_>> {
    text.starts_with('[')
        .then_some(KnownElements { text, at: 1 })
}

/// The members of `text`, an object already known to be valid JSON, as (key, value) with the
/// key as written between its quotes, escapes kept; `None` when it is not an object. The tests'
/// reference for [`known_objects`], which walks the members itself.
#[cfg(test)]
pub fn known_members(text: &str) -> Option<KnownMembers<'_>> {
    text.starts_with('{')
        .then_some(KnownMembers { text, at: 1 })
}

/// Walks `text`, an array already known to be valid JSON whose elements should all be objects,
/// each element's bytes read once: `visit` gets each element's members. The count of elements,
/// or `None` when an element is not an object or `visit` answered false (what it leaves unread
/// of its element is skipped here).
pub fn known_objects<'a>(
    text: &'a str,
    mut visit: impl FnMut(&mut KnownMembers<'a>) -> bool,
) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'[') {
        return None;
    }
    let (mut at, mut count) = (1, 0);
    loop {
        at = skip_space(bytes, at);
        if bytes.get(at) == Some(&b',') {
            at = skip_space(bytes, at + 1);
        }
        match bytes.get(at) {
            Some(b']') => return Some(count),
            Some(b'{') => {}
            _ => return None,
        }
        let mut members = KnownMembers { text, at: at + 1 };
        if !visit(&mut members) {
            return None;
        }
        members.by_ref().for_each(drop);
        // The members stop before the element's closing brace.
        at = skip_space(bytes, members.at);
        if bytes.get(at) != Some(&b'}') {
            return None;
        }
        at += 1;
        count += 1;
    }
}

pub struct KnownElements<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for KnownElements<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let mut i = skip_space(bytes, self.at);
        if bytes.get(i) == Some(&b',') {
            i = skip_space(bytes, i + 1);
        }
        if matches!(bytes.get(i), None | Some(b']')) {
            return None;
        }
        let end = value_end(bytes, i);
        self.at = end;
        self.text.get(i..end)
    }
}

pub struct KnownMembers<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Iterator for KnownMembers<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        let bytes = self.text.as_bytes();
        let mut i = skip_space(bytes, self.at);
        if bytes.get(i) == Some(&b',') {
            i = skip_space(bytes, i + 1);
        }
        if bytes.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(bytes, i + 1);
        let key = self.text.get(i + 1..key_end)?;
        // Past the closing quote, the colon and the space around it.
        let colon = skip_space(bytes, key_end + 1);
        let start = skip_space(bytes, colon + 1);
        let end = value_end(bytes, start);
        self.at = end;
        Some((key, self.text.get(start..end)?))
    }
}

fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while matches!(bytes.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Where the value starting at `start` ends, in text known to be valid JSON.
fn value_end(bytes: &[u8], start: usize) -> usize {
    match bytes.get(start) {
        Some(b'"') => string_end(bytes, start + 1) + 1,
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while let Some(&b) = bytes.get(i) {
                match b {
                    b'"' => {
                        i = string_end(bytes, i + 1);
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            bytes.len()
        }
        // A number or a literal runs to the next separator.
        _ => {
            let mut i = start;
            while !matches!(
                bytes.get(i),
                None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                i += 1;
            }
            i
        }
    }
}

/// Reads `T` from a whole body. Its UTF-8 is checked once, whole: read from bytes, serde checks
/// each string on its own, at a call's cost per string. A body that is not UTF-8 is read as
/// bytes, for serde's own error.
pub fn from_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
}

/// A value's compact text, through `io::Write` into a `Vec`: `Value`'s `Display` goes through
/// `fmt` a piece at a time, at several times the instructions.
pub fn to_bytes(value: &serde_json::Value) -> Vec<u8> {
    // A `Value` always serialises (its keys are strings); the fallback is never taken.
    serde_json::to_vec(value).unwrap_or_else(|_| value.to_string().into_bytes())
}

/// Writes `s` as a JSON string literal, as serde_json writes it.
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    if needs_no_escape(s.as_bytes()) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // serde_json's string escaping cannot fail when writing into a Vec.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// Writes `v` byte for byte as serde_json's compact writer writes it (an object's members in
/// its map's order), its strings through [`write_json_str`], which passes text with nothing to
/// escape eight bytes at a time where serde's writer looks up every byte.
pub fn write_value(out: &mut Vec<u8>, v: &serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // serde_json's own number writer; writing into a `Vec` cannot fail.
        Value::Number(n) => {
            let _ = serde_json::to_writer(&mut *out, n);
        }
        Value::String(s) => write_json_str(out, s),
        Value::Array(items) => write::array(out, items, |x, out| write_value(out, x)),
        Value::Object(members) => {
            out.push(b'{');
            for (i, (key, x)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_str(out, key);
                out.push(b':');
                write_value(out, x);
            }
            out.push(b'}');
        }
    }
}

/// True when `s` has no quote, backslash or control character: JSON text as it is. Checked
/// eight bytes at a time, where serde_json looks up each byte in a table.
fn needs_no_escape(s: &[u8]) -> bool {
    let mut words = s.chunks_exact(8);
    let plain = words.all(|w| {
        // Never short: a zero word (control characters) stands for the impossible.
        let word = w.try_into().map_or(0, u64::from_le_bytes);
        scan::special_bytes(word) == 0
    });
    plain
        && words
            .remainder()
            .iter()
            .all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// `raw` without the line breaks between its tokens (a client's pretty-printed JSON), so that it
/// can be written into an event's single `data:` line; JSON strings hold none of their own.
pub fn one_line(raw: &RawValue) -> Box<RawValue> {
    let text = raw.get();
    if !text.contains(['\n', '\r']) {
        return raw.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if c.is_ascii_whitespace() {
            continue;
        }
        out.push(c);
    }
    // Only space outside strings is gone, so this is the same JSON.
    RawValue::from_string(out).unwrap_or_else(|_| raw.to_owned())
}

/// A raw value from a literal the gateway itself writes.
pub fn raw_literal(text: &'static str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap_or_else(|_| {
        // Only reachable if a literal in this crate is malformed JSON.
        RawValue::from_string("null".to_owned()).unwrap_or_default()
    })
}

/// Serialises `value` as a raw value.
pub fn to_raw<T: serde::Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| raw_literal("null"))
}

/// JSON's type name of a raw value, for messages like "got a string".
pub fn type_name(raw: Raw<'_>) -> &'static str {
    match raw.0.as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// A typed read of one raw value, with the expectation named on failure.
pub fn as_str(raw: Raw<'_>) -> Result<Cow<'_, str>, Expected> {
    let text = raw.0;
    if !text.starts_with('"') {
        return Err(Expected::String);
    }
    // A raw value is valid JSON: a string without escapes is its text between the quotes.
    if let Some(inner) = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|inner| !inner.contains('\\'))
    {
        return Ok(Cow::Borrowed(inner));
    }
    serde_json::from_str::<Cow<'_, str>>(text).map_err(|_| Expected::String)
}

pub fn as_bool(raw: Raw<'_>) -> Result<bool, Expected> {
    match raw.0 {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(Expected::Bool),
    }
}

pub fn as_f64(raw: Raw<'_>) -> Result<f64, Expected> {
    let first = raw.0.as_bytes().first().copied().unwrap_or(b'x');
    if !(first == b'-' || first.is_ascii_digit()) {
        return Err(Expected::Number);
    }
    serde_json::from_str::<f64>(raw.0).map_err(|_| Expected::Number)
}

/// An integer; `2.0` is refused as OpenAI's API does, so the upstream never sees a float here.
pub fn as_i64(raw: Raw<'_>) -> Result<i64, Expected> {
    serde_json::from_str::<i64>(raw.0).map_err(|_| Expected::Integer)
}

/// The elements of an array, found by brackets and quotes alone: the text is known valid.
pub fn as_array(raw: Raw<'_>) -> Result<Vec<Raw<'_>>, Expected> {
    known_elements(raw.0)
        .map(|elements| elements.map(Raw).collect())
        .ok_or(Expected::Array)
}

/// That `raw` is an array, its elements left unread.
pub fn is_array(raw: Raw<'_>) -> Result<(), Expected> {
    known_elements(raw.0).map(drop).ok_or(Expected::Array)
}

pub fn as_object(raw: Raw<'_>) -> Result<RawObject<'_>, Expected> {
    RawObject::from_raw(raw).ok_or(Expected::Object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_serde_writes_them() {
        let texts = [
            "",
            "plain",
            "quote \" backslash \\ slash / newline \n tab \t \u{1} \u{7f}",
            "é日本😀 past ASCII",
            "a longer text, past eight bytes, with nothing to escape in it at all",
        ];
        let mut values = vec![
            serde_json::json!(null),
            serde_json::json!(true),
            serde_json::json!(false),
            serde_json::json!(0),
            serde_json::json!(-17),
            serde_json::json!(u64::MAX),
            serde_json::json!(i64::MIN),
            serde_json::json!(2.5),
            serde_json::json!(1e300),
            serde_json::json!(-0.0),
            serde_json::json!([]),
            serde_json::json!({}),
        ];
        for t in texts {
            values.push(serde_json::json!(t));
            values.push(serde_json::json!({ t: t, "z": [t, 1, null, {"k": t}], "a": {} }));
        }
        values.push(serde_json::Value::Array(values.clone()));
        for v in &values {
            let mut got = Vec::new();
            write_value(&mut got, v);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                serde_json::to_string(v).unwrap()
            );
        }
    }

    #[test]
    fn strings_are_written_as_serde_writes_them() {
        // Every character below 0x80 at every position of a string of up to 17 bytes, among
        // ASCII and among two-byte UTF-8: the eight-at-a-time check and the tail's byte check.
        for len in 0..=17 {
            for filler in ["a", "é"] {
                let base: Vec<char> = filler.chars().cycle().take(len).collect();
                for at in 0..=len {
                    for c in (0u8..0x80).map(char::from).chain(['\u{7f}', 'ÿ', '€']) {
                        let mut chars = base.clone();
                        chars.insert(at, c);
                        let text: String = chars.into_iter().collect();
                        let mut out = Vec::new();
                        write_json_str(&mut out, &text);
                        assert_eq!(out, serde_json::to_vec(&text).unwrap(), "{text:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn lookups_find_what_a_search_of_the_keys_finds() {
        // The request fields the gateway looks up, and keys that share their bits.
        let names = [
            "model",
            "messages",
            "stream",
            "stream_options",
            "max_tokens",
            "temperature",
            "top_p",
            "n",
            "stop",
            "tools",
            "tool_choice",
            "logprobs",
            "top_logprobs",
            "thinking",
            "input",
            "instructions",
            "system",
            "metadata",
            "user",
            "",
            "a",
            "é",
            "x_tokens",
            "mx",
            "nn",
        ];
        let search = |obj: &RawObject, k: &str| {
            obj.entries
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.to_string())
        };
        for take in 0..names.len() {
            let body = format!(
                "{{{}}}",
                names[..take]
                    .iter()
                    .enumerate()
                    .map(|(i, k)| format!("\"{k}\":{i}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let mut obj = RawObject::parse(body.as_bytes()).unwrap();
            for _ in 0..2 {
                for k in names {
                    assert_eq!(
                        obj.get(k).map(|v| v.get().to_owned()),
                        search(&obj, k),
                        "{k} in {body}"
                    );
                    assert_eq!(obj.contains(k), search(&obj, k).is_some());
                }
                // Edited: a key removed and one added are found as a search finds them.
                obj.remove(names[take / 2]);
                obj.set(names[names.len() - 1 - take / 3], to_raw("v"));
            }
        }
    }

    #[test]
    fn keeps_order_and_raw_values() {
        let src = br#"{"b":1,"a":{"x": [1, 2]},"model":"m"}"#;
        let mut obj = RawObject::parse(src).unwrap();
        obj.set("model", to_raw("n"));
        assert_eq!(obj.to_vec(), br#"{"b":1,"a":{"x": [1, 2]},"model":"n"}"#);
    }

    #[test]
    fn last_duplicate_wins() {
        let obj = RawObject::parse(br#"{"a":1,"a":2}"#).unwrap();
        assert_eq!(obj.get("a").unwrap().get(), "2");
        assert_eq!(obj.to_vec(), br#"{"a":2}"#);
    }

    #[test]
    fn escaped_keys_round_trip() {
        let obj = RawObject::parse(br#"{"a\"b":true}"#).unwrap();
        assert!(obj.contains("a\"b"));
        assert_eq!(obj.to_vec(), br#"{"a\"b":true}"#);
    }

    #[test]
    fn rejects_non_objects_and_trailing_garbage() {
        assert!(RawObject::parse(b"[1]").is_err());
        assert!(RawObject::parse(b"{} x").is_err());
        assert!(RawObject::parse(b"{\"a\":").is_err());
    }

    fn problem(body: &str) -> String {
        if RawObject::parse(body.as_bytes()).is_err() {
            return "syntax".into();
        }
        match check_structure(body.as_bytes()) {
            Ok(()) => "ok".into(),
            Err(BodyProblem::RepeatedKey { path }) => format!("repeated {path}"),
            Err(BodyProblem::TooDeep { path }) => format!("deep {path}"),
        }
    }

    #[test]
    fn repeated_keys_are_found_at_any_depth_with_their_path() {
        assert_eq!(
            problem(r#"{"model":"a","x":1,"model":"b"}"#),
            "repeated model"
        );
        assert_eq!(
            problem(r#"{"messages":[{"role":"user"},{"role":"user","role":"system"}]}"#),
            "repeated messages[1].role"
        );
        // Escaped spellings of one key are the same key to every parser.
        assert_eq!(problem(r#"{"model":1,"mod\u0065l":2}"#), "repeated model");
        // A lone surrogate is one code unit to the parsers that accept it, whatever the case of
        // its hex digits (found by the hostile harness, tests/hostile, reading keys on its own).
        assert_eq!(
            problem(r#"{"m":{"\ud800":1,"\uD800":2}}"#),
            "repeated m.\u{fffd}\u{fffd}\u{fffd}"
        );
        assert_eq!(problem(r#"{"m":{"\ud800":1,"\udc00":2}}"#), "ok");
        // The empty key is named as such (found by request_bytes: the refusal's param was "").
        assert_eq!(problem(r#"{"":1,"":2}"#), r#"repeated """#);
        assert_eq!(problem(r#"{"a":{"":1,"":2}}"#), r#"repeated a."""#);
        assert_eq!(problem(r#"{"a":{"b":1},"c":{"b":2}}"#), "ok");
        // Strings that look like structure are skipped whole, escapes included.
        assert_eq!(
            problem(r#"{"a":"x\\\",\"a\":{[","b":[1e999,{"c":1,"c":2}]}"#),
            "repeated b[1].c"
        );
        assert_eq!(
            problem(r#"{"t":{"a":[{"k":1},{"k":2}],"b":{"x":{"y":1,"y":1}}}}"#),
            "repeated t.b.x.y"
        );
    }

    #[test]
    fn many_keys_switch_to_the_set_and_still_find_a_repeat() {
        let mut body = String::from("{");
        for i in 0..1000 {
            body.push_str(&format!("\"k{i}\":{i},"));
        }
        body.push_str("\"k3\":0}");
        assert_eq!(problem(&body), "repeated k3");
        body.truncate(body.len() - 8); // drops `,"k3":0}`
        body.push('}');
        assert_eq!(problem(&body), "ok");
    }

    #[test]
    fn nesting_is_bounded_and_syntax_errors_stay_syntax() {
        let ok = format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(problem(&ok), "ok");
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(
            problem(&deep).starts_with("deep a[0][0]"),
            "{}",
            problem(&deep)
        );
        assert_eq!(problem(r#"{"a":1"#), "syntax");
        assert_eq!(problem(r#"{"a":1} x"#), "syntax");
    }

    /// The walks over known-valid JSON find the same pieces serde does, whatever the spacing
    /// and whatever brackets and quotes hide inside strings.
    #[test]
    fn known_walks_match_serde() {
        let texts = [
            "[]",
            "[ ]",
            r#"[1,"a",null,true,{"k":[1,2]},[],-2.5e-3]"#,
            " [ \"]\" ,\t{ \"a\\\"]\" : \"}\" }\n, [[\"[\"]] ] ",
            r#"["a string longer than the short loop, with \"escapes\" and \\ inside", 0]"#,
        ];
        for text in texts {
            let trimmed = text.trim();
            let want: Vec<&RawValue> = serde_json::from_str(trimmed).unwrap();
            let got: Vec<&str> = known_elements(trimmed).unwrap().collect();
            let want: Vec<&str> = want.iter().map(|r| r.get()).collect();
            assert_eq!(got, want, "{text}");
        }
        let objects = [
            "{}",
            "{ }",
            r#"{"a":1,"b" : "x" , "c":{"d":[{"e":"}"}]},"e\"q":null,"f":false}"#,
            "{\n \"k\" :\t[ 1 , 2 ] \n}",
        ];
        for text in objects {
            let want: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(text).unwrap();
            let got: Vec<(&str, &str)> = known_members(text).unwrap().collect();
            assert_eq!(got.len(), want.len(), "{text}");
            for ((key, value), (wk, wv)) in got.iter().zip(&want) {
                let key: String = serde_json::from_str(&format!("\"{key}\"")).unwrap();
                assert_eq!(&key, wk);
                assert_eq!(
                    &serde_json::from_str::<serde_json::Value>(value).unwrap(),
                    wv
                );
            }
        }
        assert!(known_elements("{}").is_none());
        assert!(known_members("[]").is_none());
    }

    /// The one-pass walk over an array of objects finds the members the two walks find, read
    /// whole or only in part, and refuses an array with any element that is not an object.
    #[test]
    fn known_objects_match_the_two_walks() {
        let arrays = [
            "[]",
            " [ { } , {\"a\" : 1} ]",
            r#"[{"role":"user","content":"a } ] \" quote"},{"k":{"n":[{"x":"}"}]},"z":null}]"#,
            "[\n{\"a\":[1,2]}\n,\t{\"b\":\"]\"}\n]",
        ];
        for text in arrays {
            let want: Vec<Vec<(&str, &str)>> = known_elements(text.trim())
                .unwrap()
                .map(|e| known_members(e).unwrap().collect())
                .collect();
            let mut whole = Vec::new();
            let n = known_objects(text.trim(), |m| {
                whole.push(m.collect::<Vec<_>>());
                true
            });
            assert_eq!(n, Some(want.len()), "{text}");
            assert_eq!(whole, want, "{text}");
            // Reading only each element's first member still finds every element.
            let mut firsts = Vec::new();
            let n = known_objects(text.trim(), |m| {
                firsts.push(m.next());
                true
            });
            assert_eq!(n, Some(want.len()), "{text}");
            let want_firsts: Vec<_> = want.iter().map(|w| w.first().copied()).collect();
            assert_eq!(firsts, want_firsts, "{text}");
        }
        assert_eq!(known_objects(r#"[{"a":1},2]"#, |_| true), None);
        assert_eq!(known_objects(r#"[{"a":1},{"b":2}]"#, |_| false), None);
        assert_eq!(known_objects(r#"{"a":1}"#, |_| true), None);
    }

    #[test]
    fn strings_read_borrowed_when_they_can() {
        let raw: Box<RawValue> = serde_json::from_str(r#""plain""#).unwrap();
        assert!(matches!(as_str((&*raw).into()), Ok(Cow::Borrowed("plain"))));
        let raw: Box<RawValue> = serde_json::from_str(r#""a\nb""#).unwrap();
        assert_eq!(as_str((&*raw).into()).unwrap(), "a\nb");
        let raw: Box<RawValue> = serde_json::from_str(r#""""#).unwrap();
        assert_eq!(as_str((&*raw).into()).unwrap(), "");
        let raw: Box<RawValue> = serde_json::from_str(r#""\ud800""#).unwrap();
        assert_eq!(as_str((&*raw).into()), Err(Expected::String));
    }

    #[test]
    fn typed_reads() {
        let v: Box<RawValue> = RawValue::from_string("2.0".into()).unwrap();
        assert_eq!(as_i64((&*v).into()), Err(Expected::Integer));
        assert_eq!(as_f64((&*v).into()), Ok(2.0));
        let s: Box<RawValue> = RawValue::from_string("\"x\\n\"".into()).unwrap();
        assert_eq!(as_str((&*s).into()).unwrap(), "x\n");
        assert_eq!(as_bool((&*s).into()), Err(Expected::Bool));
    }

    #[test]
    fn one_line_drops_only_the_space_between_tokens() {
        let raw = |t: &str| RawValue::from_string(t.to_owned()).unwrap();
        // Already on one line: kept as it is, spaces and all.
        assert_eq!(
            one_line(&raw("{ \"a\" : [1, 2] }")).get(),
            "{ \"a\" : [1, 2] }"
        );
        let pretty = "{\n  \"a b\": \"x \\\" \\\\\",\r\n  \"c\": [\n    1,\n\t2\n  ],\n  \"d\": \"\\n é\"\n}";
        let flat = one_line(&raw(pretty));
        assert_eq!(flat.get(), r#"{"a b":"x \" \\","c":[1,2],"d":"\n é"}"#);
        let parsed = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(parsed(flat.get()), parsed(pretty));
    }
}
