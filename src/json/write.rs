//! JSON objects written member by member into a `Vec<u8>`, byte for byte as serde_json's compact writer writes a struct with the same members in the same order.
//!
//! Keys are the writer's own literals, written as they are; strings go through
//! [`write_json_str`], numbers through `itoa` and serde_json's float writer, raw values as
//! their text. What to leave out (serde's `skip_serializing_if`) is the caller's to decide.

use serde_json::value::RawValue;

use super::write_json_str;

/// An object being written; [`Object::close`] ends it.
pub struct Object<'o> {
    out: &'o mut Vec<u8>,
    empty: bool,
}

impl<'o> Object<'o> {
    pub fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    /// Starts the member `key` (a literal with nothing to escape): the text its value is
    /// written to follows.
    // Inlined where the key is a literal, its copy is a few moves rather than a `memcpy` call.
    #[inline]
    pub fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    pub fn str(&mut self, key: &str, value: &str) {
        write_json_str(self.key(key), value);
    }

    /// `value` when there is one, nothing otherwise.
    pub fn some_str(&mut self, key: &str, value: Option<&str>) {
        if let Some(v) = value {
            self.str(key, v);
        }
    }

    /// `value` when there is one, `null` otherwise.
    pub fn str_or_null(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(v) => self.str(key, v),
            None => self.key(key).extend_from_slice(b"null"),
        }
    }

    pub fn bool(&mut self, key: &str, value: bool) {
        let text: &[u8] = if value { b"true" } else { b"false" };
        self.key(key).extend_from_slice(text);
    }

    pub fn some_bool(&mut self, key: &str, value: Option<bool>) {
        if let Some(v) = value {
            self.bool(key, v);
        }
    }

    /// Any integer, as serde writes it.
    pub fn int(&mut self, key: &str, value: impl itoa::Integer) {
        let mut n = itoa::Buffer::new();
        self.key(key).extend_from_slice(n.format(value).as_bytes());
    }

    pub fn some_u64(&mut self, key: &str, value: Option<u64>) {
        if let Some(v) = value {
            let mut n = itoa::Buffer::new();
            self.key(key).extend_from_slice(n.format(v).as_bytes());
        }
    }

    pub fn some_f64(&mut self, key: &str, value: Option<f64>) {
        if let Some(v) = value {
            // serde_json's own float writer (shortest round trip, `null` for what JSON cannot
            // hold); writing into a `Vec` cannot fail.
            let _ = serde_json::to_writer(&mut *self.key(key), &v);
        }
    }

    pub fn raw(&mut self, key: &str, value: &RawValue) {
        self.key(key).extend_from_slice(value.get().as_bytes());
    }

    pub fn close(self) {
        self.out.push(b'}');
    }
}

/// Writes `items` as an array, each by `item`.
pub fn array<T>(out: &mut Vec<u8>, items: &[T], mut item: impl FnMut(&T, &mut Vec<u8>)) {
    out.push(b'[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        item(x, out);
    }
    out.push(b']');
}
