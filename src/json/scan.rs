//! One pass over a request body that checks its JSON and its structure and finds its top-level members, for the common body.
//!
//! [`object`] answers only for bodies it is sure of: valid JSON, an object at the top, no key
//! repeated in any object, nesting well inside [`MAX_DEPTH`], no escape inside a key. For
//! anything else it answers `None` and the caller takes the full path (serde's parse, then
//! [`super::check_structure`]), which refuses with the exact error or accepts the odd body. So
//! this pass never has to name a problem, only to never accept what the full path refuses.

use std::borrow::Cow;
use std::collections::HashSet;

use smallvec::SmallVec;

use super::{RawObject, LINEAR_KEYS, MAX_DEPTH};

/// The body's top-level object, when the body is one the pass is sure of; what it finds is
/// what serde's parse into [`RawObject`] finds, member for member.
pub fn object(bytes: &[u8]) -> Option<RawObject<'_>> {
    object_in(std::str::from_utf8(bytes).ok()?)
}

/// [`object`] for text already known to be UTF-8.
pub fn object_in(text: &str) -> Option<RawObject<'_>> {
    let mut scan = Scan {
        text,
        b: text.as_bytes(),
        i: 0,
    };
    scan.space();
    if scan.peek() != Some(b'{') {
        return None;
    }
    scan.document().map(RawObject::new)
}

/// Bytes `start..end` of the body.
type Span = (usize, usize);

type Members<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// The keys of every open object, innermost last.
type Keys<'a> = SmallVec<[&'a [u8]; 32]>;

enum Frame<'a> {
    Object {
        /// Where this object's keys start in the list of keys of all open objects.
        first: usize,
        /// All of its keys, once it has more than [`LINEAR_KEYS`].
        many: Option<HashSet<&'a [u8]>>,
    },
    Array,
}

struct Scan<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

/// The pass stops short of the limit: the full path decides what happens near it.
const DEPTH: usize = MAX_DEPTH - 2;

pub(crate) const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
pub(crate) const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The high bit of each zero byte of `word` set; above the lowest zero byte a byte may be
/// flagged wrongly (the subtraction borrows), at or below it never.
pub(crate) fn zeros(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

/// The high bit set of each byte of `word` (little-endian) that a JSON string cannot hold as it
/// is: a quote, a backslash or a control character. The lowest flagged byte is flagged exactly;
/// above it a byte may be flagged wrongly. Zero exactly when none of the eight is one of them.
pub(crate) fn special_bytes(word: u64) -> u64 {
    zeros(word ^ (ONES * u64::from(b'"')))
        | zeros(word ^ (ONES * u64::from(b'\\')))
        | word.wrapping_sub(ONES * 0x20) & !word & HIGHS
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// The top-level object's members, then nothing but space.
    fn document(&mut self) -> Option<Members<'a>> {
        let mut members: Members<'a> = Vec::with_capacity(16);
        // On the stack for usual bodies; deeper or wider ones spill to the heap.
        let mut stack: SmallVec<[Frame<'a>; 8]> = SmallVec::new();
        let mut keys: Keys<'a> = SmallVec::new();
        // The top-level member whose value is being read.
        let mut key: Span = (0, 0);
        let mut start = 0;
        'value: loop {
            // At the first byte of a value.
            match self.peek()? {
                open @ (b'{' | b'[') => {
                    if stack.len() >= DEPTH {
                        return None;
                    }
                    self.i += 1;
                    self.space();
                    if open == b'[' {
                        stack.push(Frame::Array);
                        if self.peek() != Some(b']') {
                            continue 'value;
                        }
                        self.i += 1;
                        stack.pop();
                    } else {
                        stack.push(Frame::Object {
                            first: keys.len(),
                            many: None,
                        });
                        if self.peek() != Some(b'}') {
                            let k = self.key(&mut stack, &mut keys)?;
                            if stack.len() == 1 {
                                (key, start) = (k, self.i);
                            }
                            continue 'value;
                        }
                        self.i += 1;
                        stack.pop();
                    }
                }
                b'"' => {
                    self.i += 1;
                    self.string()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return None,
            }
            // A value has ended at `self.i`: close what it closes, up to the next value.
            loop {
                if stack.len() == 1 {
                    let key = self.text.get(key.0..key.1)?;
                    let value = self.text.get(start..self.i)?;
                    members.push((Cow::Borrowed(key), Cow::Borrowed(value)));
                }
                self.space();
                match (stack.last_mut(), self.peek()) {
                    (None, _) => return (self.i == self.b.len()).then_some(members),
                    (Some(Frame::Array), Some(b',')) => {
                        self.i += 1;
                        self.space();
                        continue 'value;
                    }
                    (Some(Frame::Object { .. }), Some(b',')) => {
                        self.i += 1;
                        self.space();
                        let k = self.key(&mut stack, &mut keys)?;
                        if stack.len() == 1 {
                            (key, start) = (k, self.i);
                        }
                        continue 'value;
                    }
                    (Some(Frame::Array), Some(b']')) => {
                        self.i += 1;
                        stack.pop();
                    }
                    (Some(Frame::Object { first, .. }), Some(b'}')) => {
                        keys.truncate(*first);
                        self.i += 1;
                        stack.pop();
                    }
                    _ => return None,
                }
            }
        }
    }

    /// A key, its colon and the space up to its value; `None` for a key with an escape or one
    /// the innermost object already has.
    fn key(&mut self, stack: &mut [Frame<'a>], keys: &mut Keys<'a>) -> Option<Span> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let from = self.i + 1;
        self.i = from;
        if self.string()? {
            return None;
        }
        let span = (from, self.i - 1);
        let key = self.b.get(span.0..span.1)?;
        let Some(Frame::Object { first, many }) = stack.last_mut() else {
            return None;
        };
        let fresh = match many {
            Some(set) => set.insert(key),
            None => {
                let known = keys.get(*first..)?;
                if known.contains(&key) {
                    false
                } else if known.len() < LINEAR_KEYS {
                    keys.push(key);
                    true
                } else {
                    // Past a few keys, a hash set, so many keys cannot make this quadratic.
                    let mut set: HashSet<&'a [u8]> = known.iter().copied().collect();
                    set.insert(key);
                    *many = Some(set);
                    true
                }
            }
        };
        if !fresh {
            return None;
        }
        self.space();
        if self.peek() != Some(b':') {
            return None;
        }
        self.i += 1;
        self.space();
        Some(span)
    }

    /// A string's rest after its opening quote, up to and past its closing one; answers
    /// whether it had an escape. Control characters and malformed escapes are refused, as
    /// serde refuses them.
    fn string(&mut self) -> Option<bool> {
        let mut escaped = false;
        loop {
            // Eight bytes at a time up to the first quote, backslash or control character.
            while let Some(chunk) = self.b.get(self.i..self.i + 8) {
                let special = special_bytes(u64::from_le_bytes(chunk.try_into().ok()?));
                if special != 0 {
                    // Little-endian: the lowest flagged byte comes first, and is flagged exactly.
                    self.i += (special.trailing_zeros() / 8) as usize;
                    break;
                }
                self.i += 8;
            }
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    match self.b.get(self.i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = self.b.get(self.i + 2..self.i + 6)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 6;
                        }
                        _ => return None,
                    }
                }
                0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.b.get(self.i..self.i + word.len())? != word {
            return None;
        }
        self.i += word.len();
        Some(())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`; what follows is the caller's to check.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let from = self.i;
        self.digits();
        (self.i > from).then_some(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]
    use super::*;

    /// What the full path makes of `body`: the members, or why it refused.
    fn full(body: &[u8]) -> Result<Vec<(String, String)>, String> {
        let obj = RawObject::parse(body).map_err(|e| e.to_string())?;
        super::super::check_structure(body).map_err(|e| format!("{e:?}"))?;
        Ok(members(&obj))
    }

    fn members(obj: &RawObject<'_>) -> Vec<(String, String)> {
        obj.entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Whatever the pass accepts, the full path accepts with the same members.
    fn agrees(body: &[u8]) -> bool {
        match object(body) {
            Some(obj) => {
                assert_eq!(
                    full(body),
                    Ok(members(&obj)),
                    "{}",
                    String::from_utf8_lossy(body)
                );
                true
            }
            None => false,
        }
    }

    #[test]
    fn common_bodies_take_the_pass_and_match_the_full_path() {
        let long = "x".repeat(300);
        let bodies = [
            r#"{"model":"mock-gpt","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in five words."}],"max_tokens":64,"temperature":0}"#.to_owned(),
            "{}".to_owned(),
            " \t\r\n{ \"a\" : 1 , \"b\"\n:\t[ ] , \"c\" : { } } \n".to_owned(),
            r#"{"n":[0,-0,1.5,-2e10,3E+2,4e-3,123456789012345678901234567890,1e999]}"#.to_owned(),
            r#"{"s":"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\ude00 \ud800","t":true,"f":false,"z":null}"#.to_owned(),
            format!(r#"{{"long":"{long}","unicode":"héllo — 日本 😀","after":"{long}\"{long}"}}"#),
            r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}}]}"#.to_owned(),
            r#"{"a":{"k":1},"b":{"k":2},"c":[{"k":1},{"k":2}]}"#.to_owned(),
            format!("{{{}\"last\":0}}", (0..40).map(|i| format!("\"k{i}\":{i},")).collect::<String>()),
        ];
        for body in &bodies {
            assert!(agrees(body.as_bytes()), "the pass refused {body}");
        }
    }

    #[test]
    fn what_the_pass_is_unsure_of_goes_to_the_full_path() {
        let refused = [
            // Invalid JSON of every kind.
            "",
            "{",
            "{\"a\":1",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":[1,]}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":.5}",
            "{\"a\":-}",
            "{\"a\":1e}",
            "{\"a\":+1}",
            "{\"a\":tru}",
            "{\"a\":truex}",
            "{\"a\":nul}",
            "{\"a\":\"x\ty\"}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12g4\"}",
            "{\"a\":\"\\u12\"}",
            "{\"a\":\"unterminated}",
            "{\"a\":1} x",
            "{\"a\":1}}",
            "{'a':1}",
            "[1]",
            "\"a\"",
            "\u{feff}{}",
            // Valid, but for the full path to judge.
            "{\"a\":1,\"a\":2}",
            "{\"x\":{\"b\":[{\"c\":1,\"c\":1}]}}",
            "{\"mod\\u0065l\":1}",
            "{\"m\":{\"k\\n\":1}}",
        ];
        for body in refused {
            assert!(!agrees(body.as_bytes()), "the pass accepted {body:?}");
        }
        assert!(!agrees(b"{\"a\":\"\xff\"}"));
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert!(!agrees(deep.as_bytes()));
        let repeated_late = format!(
            "{{{}\"k3\":0}}",
            (0..40)
                .map(|i| format!("\"k{i}\":{i},"))
                .collect::<String>()
        );
        assert!(!agrees(repeated_late.as_bytes()));
    }

    /// Every one-piece edit of valid bodies (a piece inserted, a byte replaced or dropped), so
    /// the pass meets bodies one step from valid everywhere: it may accept some, and must agree.
    #[test]
    fn one_edit_from_valid_the_pass_still_agrees() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi \"x\""}],"n":-1.5e3,"t":[true,null,{}]}"#,
            r#"{"a":{"b":[1,{"c":"d"}],"e":false},"f":"é"}"#,
        ];
        let mut accepted = 0;
        for body in bodies {
            for at in 0..=body.len() {
                for piece in PIECES {
                    let mut edited = body.as_bytes().to_vec();
                    edited.splice(at..at, piece.bytes());
                    accepted += usize::from(agrees(&edited));
                    if at < body.len() {
                        let mut replaced = body.as_bytes().to_vec();
                        replaced.splice(at..=at, piece.bytes());
                        accepted += usize::from(agrees(&replaced));
                    }
                }
                if at < body.len() {
                    let mut dropped = body.as_bytes().to_vec();
                    dropped.remove(at);
                    accepted += usize::from(agrees(&dropped));
                }
            }
        }
        // Space, digits and whole values land in valid places often enough to be accepted.
        assert!(
            accepted > 100,
            "only {accepted} edited bodies took the pass"
        );
    }

    proptest::proptest! {
        /// Bodies stitched from JSON's pieces, valid or not: the pass never accepts what the
        /// full path refuses, and finds the same members when it accepts.
        #[test]
        fn the_pass_never_accepts_what_the_full_path_refuses(
            pieces in proptest::collection::vec(0usize..PIECES.len(), 0..40)
        ) {
            let mut body = String::from("{");
            for p in pieces {
                body.push_str(PIECES[p]);
            }
            body.push('}');
            agrees(body.as_bytes());
            // The same pieces without the outer braces, and with a key in front.
            agrees(body.get(1..body.len() - 1).unwrap_or("").as_bytes());
            agrees(format!("{{\"k\":{}}}", &body).as_bytes());
        }
    }

    #[rustfmt::skip]
    const PIECES: &[&str] = &[
        "\"a\"", "\"b\"", ":", ",", "{", "}", "[", "]", " ", "\n", "1", "-", "0", ".", "5",
        "e", "+", "true", "null", "fals", "\"x\\\"y\"", "\"\\u00e9\"", "\"\\q\"", "\t", "\"",
        "\\", "\"é\"", "\"\u{1}\"", "01",
    ];
}
