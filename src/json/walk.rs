//! Checked one-pass walks over JSON text for the hand readers (of requests, replies and usage objects): each function reads one piece at a position and answers where it ends, so the position stays in a register.
//!
//! Each answers `None` when unsure, and what it accepts serde accepts: what is skipped is
//! checked as serde checks what it ignores, and anything unusual (an escaped key, deep nesting,
//! and without `UTF8` a `\u` escape or a byte past ASCII) is left to serde, which also names
//! every text that is not JSON as such.

use super::scan::{special_bytes, HIGHS};

/// Containers open at once past which a walk leaves the text to serde (which refuses past 128).
pub(crate) const DEEPEST: usize = 64;

/// Reads the object whose `{` is at `i`: `member` reads each member's value, given its key and
/// where the value starts, and answers where the value ends. Answers where the object ends.
#[inline]
pub(crate) fn object<const UTF8: bool>(
    b: &[u8],
    i: usize,
    member: impl FnMut(&[u8], usize) -> Option<usize>,
) -> Option<usize> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let i = space(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    members::<UTF8>(b, i, member)
}

/// [`object`] from the key at `i` on, the members before it read already: where a stream's
/// chunks repeat the members they start with, those are checked once.
#[inline]
pub(crate) fn members<const UTF8: bool>(
    b: &[u8],
    mut i: usize,
    mut member: impl FnMut(&[u8], usize) -> Option<usize>,
) -> Option<usize> {
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (end, escaped) = string::<UTF8>(b, i + 1)?;
        // An escaped key would have to be unescaped to be matched: serde's to do.
        if escaped {
            return None;
        }
        let key = b.get(i + 1..end - 1)?;
        i = space(b, member(key, colon(b, end)?)?);
        match b.get(i)? {
            b',' => i = space(b, i + 1),
            b'}' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Reads the array whose `[` is at `at`: `element` reads each element and answers where it
/// ends. Answers where the array ends.
pub(crate) fn array(
    b: &[u8],
    at: usize,
    mut element: impl FnMut(usize) -> Option<usize>,
) -> Option<usize> {
    let mut i = space(b, at + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        i = space(b, element(i)?);
        match b.get(i)? {
            b',' => i = space(b, i + 1),
            b']' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Past the space, colon and space after a key that ends at `i`.
pub(crate) fn colon(b: &[u8], i: usize) -> Option<usize> {
    let i = space(b, i);
    (b.get(i) == Some(&b':')).then(|| space(b, i + 1))
}

/// Skips the value at `i` inside `open` containers, checked as serde checks what it ignores;
/// answers where it ends.
pub(crate) fn skip<const UTF8: bool>(b: &[u8], i: usize, open: usize) -> Option<usize> {
    // A number (`total_tokens`) or a string (a chunk's `object`, `system_fingerprint`) is the
    // value usually skipped: read without the loop.
    match b.get(i)? {
        b'-' | b'0'..=b'9' => number(b, i),
        b'"' => Some(string::<UTF8>(b, i + 1)?.0),
        _ => skip_any::<UTF8>(b, i, open),
    }
}

/// [`skip`] for any value.
pub(crate) fn skip_any<const UTF8: bool>(b: &[u8], mut i: usize, open: usize) -> Option<usize> {
    // One bit per container opened here, set for an object: nesting is bounded by `DEEPEST`,
    // so no stack is allocated.
    let mut objects: u64 = 0;
    let mut depth = 0;
    'value: loop {
        // At the first byte of a value.
        match *b.get(i)? {
            bracket @ (b'{' | b'[') => {
                if open + depth >= DEEPEST {
                    return None;
                }
                let object = bracket == b'{';
                i = space(b, i + 1);
                if b.get(i) != Some(if object { &b'}' } else { &b']' }) {
                    objects = objects << 1 | u64::from(object);
                    depth += 1;
                    if object {
                        i = key::<UTF8>(b, i)?;
                    }
                    continue 'value;
                }
                i += 1;
            }
            b'"' => i = string::<UTF8>(b, i + 1)?.0,
            b't' => i = literal(b, i, b"true")?,
            b'f' => i = literal(b, i, b"false")?,
            b'n' => i = literal(b, i, b"null")?,
            b'-' | b'0'..=b'9' => i = number(b, i)?,
            _ => return None,
        }
        // A value has ended: close what it closes, up to the next value.
        while depth > 0 {
            i = space(b, i);
            let object = objects & 1 == 1;
            match (b.get(i)?, object) {
                (b',', _) => {
                    i = space(b, i + 1);
                    if object {
                        i = key::<UTF8>(b, i)?;
                    }
                    continue 'value;
                }
                (b']', false) | (b'}', true) => {
                    i += 1;
                    objects >>= 1;
                    depth -= 1;
                }
                _ => return None,
            }
        }
        return Some(i);
    }
}

/// Past the key at `i` of a skipped object, up to its value.
fn key<const UTF8: bool>(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    colon(b, string::<UTF8>(b, i + 1)?.0)
}

/// The string whose opening quote ends at `i`: where it ends (past its closing quote), and
/// whether it had an escape. Control characters and malformed escapes are refused, as serde
/// refuses them. Without `UTF8`, so are `\u` and bytes past ASCII, which serde checks in some
/// strings and not in others: surrogates where it keeps the string, UTF-8 where it keeps it
/// from a text that is not UTF-8 (its slice reader). With `UTF8` (the whole text was checked as
/// UTF-8) both pass, as serde passes them in what it skips: the four hex digits of a `\u` are
/// checked, and a string kept is the caller's to unescape, by serde, which checks the rest.
// Inlined: read for every key, a call costs as much as its work.
#[inline(always)]
pub(crate) fn string<const UTF8: bool>(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        // Eight bytes at a time up to the first quote, backslash, control character or byte past
        // ASCII (a byte flagged by its high bit, or a byte below 0x20 by the subtraction).
        while let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
            let word = u64::from_le_bytes(*chunk);
            let special = if UTF8 {
                special_bytes(word)
            } else {
                special_bytes(word) | word & HIGHS
            };
            if special != 0 {
                // Little-endian: the lowest flagged byte comes first, and is flagged exactly.
                i += (special.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        match *b.get(i)? {
            b'"' => return Some((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                match b.get(i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' if UTF8 => {
                        if !b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        i += 6;
                    }
                    _ => return None,
                }
            }
            0..=0x1f => return None,
            0x80.. if !UTF8 => return None,
            _ => i += 1,
        }
    }
}

/// Past `word` at `i`.
pub(crate) fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    b.get(i..)?.starts_with(word).then_some(i + word.len())
}

/// Past the `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` at `i`; what follows is the
/// caller's to check.
pub(crate) fn number(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i),
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        i = some_digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = some_digits(b, i)?;
    }
    Some(i)
}

/// Past the digits at `i`.
pub(crate) fn digits(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// Past the digits at `i`, at least one.
pub(crate) fn some_digits(b: &[u8], i: usize) -> Option<usize> {
    let end = digits(b, i);
    (end > i).then_some(end)
}

/// Past the JSON space at `i`.
pub(crate) fn space(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}
