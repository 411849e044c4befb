//! The lenient wire types ([`Loose`], `lax_struct!`, [`Raw`]) read by hand in one pass: what serde's read of the same types finds, when the reader is sure of the text, for a fraction of serde's work and code.
//!
//! The walk is [`json::walk`]'s, over text checked as UTF-8 whole: every value is checked as
//! serde checks it, skipped values as serde checks what it ignores, kept strings borrowed or
//! unescaped by serde. Anything the reader is unsure of (an escaped key, deep nesting) answers
//! `None`, and the caller asks serde, which also names every failure. Every `lax_struct!` is
//! readable this way: the macro writes its [`Hand`] impl.
//!
//! [`json::walk`]: crate::json::walk

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;

use super::lax::{Both, First, Loose, Raw, RawText, Spanned};
use crate::json::walk::{self, array, literal, number, space};

/// A type read by hand from JSON text.
pub trait Hand<'a>: Sized {
    /// Reads the value that starts at `at`, inside `open` containers: what serde's read of
    /// it finds, and where it ends; `None` when the reader is unsure or serde would fail.
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)>;

    /// Reads the object at `at` as a [`Loose`] holding `Self` for objects reads it: serde
    /// visits it as a map, which for most types is their read.
    fn read_map(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        Self::read(text, at, open)
    }

    /// Reads the value at `at` over `slot`, as [`Hand::read`] finds it. A struct's reader
    /// fills the struct where it lies: a member read into its parent, or an element into its
    /// array, is not moved there afterwards (a chat chunk's choice is some 190 bytes).
    fn read_into(slot: &mut Self, text: &'a str, at: usize, open: usize) -> Option<usize> {
        let (value, end) = Self::read(text, at, open)?;
        *slot = value;
        Some(end)
    }

    /// [`Hand::read_into`] over a `slot` known to hold the default: a struct's reader then
    /// need not write its default a second time (a chunk and its choice, some 200 bytes each).
    fn read_fresh(slot: &mut Self, text: &'a str, at: usize, open: usize) -> Option<usize> {
        Self::read_into(slot, text, at, open)
    }

    /// Reads the value at `at` as a new last element of `items`.
    fn read_push(items: &mut Vec<Self>, text: &'a str, at: usize, open: usize) -> Option<usize> {
        let (value, end) = Self::read(text, at, open)?;
        items.push(value);
        Some(end)
    }
}

/// The object `text` holds (and nothing but space around it), read by hand; `None` for any
/// other text and whenever the reader is unsure.
pub fn object<'a, T: Hand<'a>>(text: &'a str) -> Option<T> {
    let b = text.as_bytes();
    if b.get(space(b, 0)) != Some(&b'{') {
        return None;
    }
    value(text)
}

/// The value `text` holds, of any JSON type (and nothing but space around it), read by hand;
/// `None` whenever the reader is unsure.
pub fn value<'a, T: Hand<'a>>(text: &'a str) -> Option<T> {
    let b = text.as_bytes();
    let (value, end) = T::read(text, space(b, 0), 0)?;
    (space(b, end) == b.len()).then_some(value)
}

/// [`object`] read over `slot`, which holds the default: true when it was read (`slot` then
/// holds it), false when the reader is unsure (`slot` then holds what it got to).
pub fn object_into<'a, T: Hand<'a>>(slot: &mut T, text: &'a str) -> bool {
    let b = text.as_bytes();
    let at = space(b, 0);
    b.get(at) == Some(&b'{')
        && T::read_fresh(slot, text, at, 0).is_some_and(|end| space(b, end) == b.len())
}

impl<'a> Hand<'a> for IgnoredAny {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        Some((IgnoredAny, walk::skip::<true>(text.as_bytes(), at, open)?))
    }

    /// An object skipped as a map: serde reads each of its keys as a string, unescaped (a lone
    /// surrogate fails there, where a skipped value's key passes); a key with an escape is
    /// left to serde.
    fn read_map(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        if open >= walk::DEEPEST {
            return None;
        }
        let b = text.as_bytes();
        let end = walk::object::<true>(b, at, |_, at| walk::skip::<true>(b, at, open + 1))?;
        Some((IgnoredAny, end))
    }
}

impl<'a, T: Hand<'a>> Hand<'a> for Box<T> {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        T::read(text, at, open).map(|(value, end)| (Box::new(value), end))
    }

    fn read_map(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        T::read_map(text, at, open).map(|(value, end)| (Box::new(value), end))
    }
}

/// A value read as one of JSON's scalars, as a [`Loose`] holds it.
enum Scalar<'a> {
    Null,
    Bool(bool),
    Num(Number),
    Str(Cow<'a, str>),
}

/// Reads the string whose opening quote is at `at` as serde reads it, and where it ends:
/// borrowed from `text`, or unescaped when it has an escape.
pub fn string(text: &str, at: usize) -> Option<(Cow<'_, str>, usize)> {
    let (end, escaped) = walk::string::<true>(text.as_bytes(), at + 1)?;
    let s = if escaped {
        // Unescaped by serde, which also refuses a lone surrogate as its read would.
        Cow::Owned(serde_json::from_str::<String>(text.get(at..end)?).ok()?)
    } else {
        Cow::Borrowed(text.get(at + 1..end - 1)?)
    };
    Some((s, end))
}

/// Reads the scalar at `at` as serde reads it into a [`Loose`]; `None` for a container.
fn scalar(text: &str, at: usize) -> Option<(Scalar<'_>, usize)> {
    let b = text.as_bytes();
    Some(match *b.get(at)? {
        b'"' => {
            let (s, end) = string(text, at)?;
            (Scalar::Str(s), end)
        }
        b't' => (Scalar::Bool(true), literal(b, at, b"true")?),
        b'f' => (Scalar::Bool(false), literal(b, at, b"false")?),
        b'n' => (Scalar::Null, literal(b, at, b"null")?),
        b'-' | b'0'..=b'9' => {
            let (n, end) = number_at(text, at)?;
            (Scalar::Num(n), end)
        }
        _ => return None,
    })
}

/// Reads the number at `at` as serde reads it, and where it ends.
pub fn number_at(text: &str, at: usize) -> Option<(Number, usize)> {
    let b = text.as_bytes();
    let end = number(b, at)?;
    let digits = b.get(at..end)?;
    let n = if digits.len() <= 19 && digits.iter().all(u8::is_ascii_digit) {
        // A count (`max_tokens`): a plain integer that fits 64 bits, as serde reads it,
        // without the cost of its number parser.
        Number::from(
            digits
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
        )
    } else {
        // Parsed as serde parses it: an f64 out of range fails, as its read would.
        text.get(at..end)?.parse().ok()?
    };
    Some((n, end))
}

impl<'a, A: Hand<'a>, O: Hand<'a>> Hand<'a> for Loose<'a, A, O> {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        let b = text.as_bytes();
        match *b.get(at)? {
            b'{' => O::read_map(text, at, open).map(|(o, end)| (Loose::Obj(o), end)),
            b'[' => {
                if open >= walk::DEEPEST {
                    return None;
                }
                let mut items = Vec::new();
                let end = array(b, at, |at| A::read_push(&mut items, text, at, open + 1))?;
                Some((Loose::Arr(items), end))
            }
            _ => {
                let (s, end) = scalar(text, at)?;
                let value = match s {
                    Scalar::Null => Loose::Null,
                    Scalar::Bool(v) => Loose::Bool(v),
                    Scalar::Num(n) => Loose::Num(n),
                    Scalar::Str(s) => Loose::Str(s),
                };
                Some((value, end))
            }
        }
    }
}

impl<'a, T: Hand<'a> + Default> Hand<'a> for First<T> {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        let mut out = Self::default();
        let end = Self::read_into(&mut out, text, at, open)?;
        Some((out, end))
    }

    /// The first element is read where it will lie (a chat choice is some 190 bytes).
    fn read_into(slot: &mut Self, text: &'a str, at: usize, open: usize) -> Option<usize> {
        slot.0 = None;
        let b = text.as_bytes();
        if b.get(at) != Some(&b'[') {
            return Some(<Loose<'a>>::read(text, at, open)?.1);
        }
        if open >= walk::DEEPEST {
            return None;
        }
        array(b, at, |at| match &mut slot.0 {
            None => T::read_fresh(slot.0.insert(T::default()), text, at, open + 1),
            Some(_) => walk::skip::<true>(b, at, open + 1),
        })
    }
}

/// The raw text of the value at `at`, taken by serde's own raw reader: it checks the value as
/// the whole text's read would (it bounds no nesting there either), in one pass.
fn raw(text: &str, at: usize) -> Option<(&RawValue, usize)> {
    let rest = text.get(at..)?;
    let mut de = serde_json::Deserializer::from_str(rest);
    let value = <&RawValue>::deserialize(&mut de).ok()?;
    // The raw text starts at the value's first byte, which is `at`.
    (value.get().as_ptr() == rest.as_ptr()).then(|| (value, at + value.get().len()))
}

impl<'a> Hand<'a> for Raw<'a> {
    fn read(text: &'a str, at: usize, _open: usize) -> Option<(Self, usize)> {
        raw(text, at).map(|(value, end)| (Raw(Some(value)), end))
    }
}

impl<'a> Hand<'a> for RawText<'a> {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        // Text needs no `RawValue`: the walk checks it, without serde.
        let end = walk::skip::<true>(text.as_bytes(), at, open)?;
        Some((RawText(Some(text.get(at..end)?)), end))
    }
}

impl<'a, T: Hand<'a>> Hand<'a> for Both<'a, T> {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        let (typed, end) = T::read(text, at, open)?;
        let (raw, _) = raw(text, at)?;
        Some((
            Both {
                raw: Some(raw),
                typed,
            },
            end,
        ))
    }
}

impl<'a, T: Hand<'a>> Hand<'a> for Spanned<'a, T> {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        let (typed, end) = T::read(text, at, open)?;
        Some((
            Spanned {
                text: Some(text.get(at..end)?),
                typed,
            },
            end,
        ))
    }
}

/// Reads the value at `at` over `out` as a `lax_struct!` reads it: an object by `member`,
/// given each key and where its value starts, answering where the value ends; any other value
/// leaves `out` as it is, once checked as serde reads it. `out` holds the default (what a
/// repeated key's earlier value left is the caller's to clear).
pub fn lax_fill<'a, T>(
    out: &mut T,
    text: &'a str,
    at: usize,
    open: usize,
    mut member: impl FnMut(&mut T, &[u8], usize) -> Option<usize>,
) -> Option<usize> {
    let b = text.as_bytes();
    if b.get(at) == Some(&b'{') {
        if open >= walk::DEEPEST {
            return None;
        }
        walk::object::<true>(b, at, |key, at| member(out, key, at))
    } else {
        // A scalar is read whole (and fails where a `Loose` would); an array's elements are
        // skipped.
        Some(<Loose<'a>>::read(text, at, open)?.1)
    }
}

/// What the tests of each hand-read type share: the comparison with serde, one-byte edits,
/// made-up objects, and the fixture bodies.
#[cfg(test)]
pub(crate) mod check {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::fmt::Debug;

    use serde::Deserialize;

    use super::Hand;
    use crate::config::{Target, ThinkingStyle};

    /// Whether the hand reader answered for `text`; when it did, it read what serde's read
    /// finds, member for member (compared by their `Debug` text). Whatever it did, serde's read
    /// is what it must match.
    pub(crate) fn agrees<'a, T: Hand<'a> + Deserialize<'a> + Debug>(text: &'a [u8]) -> bool {
        let shown = String::from_utf8_lossy(text);
        let serde = serde_json::from_slice::<T>(text);
        let Some(quick) = std::str::from_utf8(text).ok().and_then(super::object::<T>) else {
            return false;
        };
        match serde {
            Ok(serde) => assert_eq!(format!("{quick:?}"), format!("{serde:?}"), "{shown}"),
            Err(e) => panic!("the hand reader read what serde refuses ({e}): {shown}"),
        }
        true
    }

    /// Asserts that each of `texts` is read by hand, as serde reads it.
    pub(crate) fn all_read<T: AsRef<str>>(
        texts: impl IntoIterator<Item = T>,
        agrees: impl Fn(&[u8]) -> bool,
    ) {
        for text in texts {
            let text = text.as_ref();
            assert!(agrees(text.as_bytes()), "left to serde: {text}");
        }
    }

    /// Values serde's read refuses (a number past f64's range, a lone surrogate) put where
    /// `{bad}` stands in each case: where a member is read (`false`), neither the hand reader
    /// nor serde reads the text, and serde names the problem; where it is skipped (`true`),
    /// both read it.
    pub(crate) fn refused_where_read(
        cases: &[(&str, bool)],
        agrees: impl Fn(&[u8]) -> bool,
        serde_reads: impl Fn(&str) -> bool,
    ) {
        for bad in ["1e400", r#""\ud800""#] {
            for (template, read) in cases {
                let text = template.replace("{bad}", bad);
                assert_eq!(agrees(text.as_bytes()), *read, "{text}");
                assert_eq!(serde_reads(&text), *read, "{text}");
            }
        }
    }

    /// Every one-byte edit of `texts` (a byte deleted, or replaced by one that matters to
    /// JSON) checked by `agrees`; answers how many the hand reader read.
    pub(crate) fn one_byte_edits(texts: &[&str], agrees: impl Fn(&[u8]) -> bool) -> usize {
        let mut read = 0;
        for text in texts {
            let text = text.as_bytes();
            for at in 0..text.len() {
                let mut deleted = text.to_vec();
                deleted.remove(at);
                read += usize::from(agrees(&deleted));
                for b in *b"{}[]\",:\\\x00\x1f\x7fe-9ntu \xc3" {
                    let mut edited = text.to_vec();
                    edited[at] = b;
                    read += usize::from(agrees(&edited));
                }
            }
        }
        read
    }

    /// Scalars of every kind a made-up object holds: escapes, surrogate pairs, bytes past
    /// ASCII, integers of 19 and 20 digits, one past 64 bits, and a negative zero.
    pub(crate) const SCALARS: [&str; 14] = [
        "null",
        "true",
        "false",
        "0",
        "-0",
        "17",
        "2.5e3",
        "9999999999999999999",
        "12345678901234567890",
        "18446744073709551616",
        r#""""#,
        r#""text""#,
        r#""a\"b\\c\nd\u00e9\ud83d\ude00""#,
        r#""é日本""#,
    ];

    /// A JSON object made of `keys` at every level from `seed` (each choice taken from its low
    /// bits), nesting to `depth`, with `scalars` among its values.
    pub(crate) fn made_up(seed: u64, depth: u32, keys: &[&str], scalars: &[&str]) -> String {
        let mut seed = seed;
        loop {
            let v = value(&mut seed, depth, keys, scalars);
            if v.starts_with('{') {
                return v;
            }
        }
    }

    fn value(seed: &mut u64, depth: u32, keys: &[&str], scalars: &[&str]) -> String {
        let mut pick = |n: usize| {
            let v = *seed % n as u64;
            *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            v as usize
        };
        match if depth == 0 { 0 } else { pick(3) } {
            0 => scalars[pick(scalars.len())].to_owned(),
            1 => {
                let n = pick(4);
                let items: Vec<String> = (0..n)
                    .map(|_| value(seed, depth - 1, keys, scalars))
                    .collect();
                format!("[{}]", items.join(","))
            }
            _ => {
                let mut chosen: Vec<&str> = (0..pick(6)).map(|_| keys[pick(keys.len())]).collect();
                chosen.sort_unstable();
                chosen.dedup();
                let members: Vec<String> = chosen
                    .iter()
                    .map(|k| format!("\"{k}\":{}", value(seed, depth - 1, keys, scalars)))
                    .collect();
                format!("{{{}}}", members.join(","))
            }
        }
    }

    /// A chat target with each way of switching thinking, its model's name `m`.
    pub(crate) fn targets() -> Vec<Target> {
        let config = crate::config::Config::parse(
            "[listen]\nbase = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"c\"\nkind = \"chat\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[[models]]\nname = \"m\"\nupstream = \"c\"\ndefault_max_tokens = 100\n",
            std::path::Path::new("."),
            &|_| None,
        )
        .unwrap();
        [
            ThinkingStyle::None,
            ThinkingStyle::ChatTemplateKwargs,
            ThinkingStyle::EnableThinking,
            ThinkingStyle::ThinkingType,
            ThinkingStyle::Anthropic,
            ThinkingStyle::OpenAi,
        ]
        .into_iter()
        .map(|thinking| {
            let p = config.models[0].primary();
            Target {
                upstream: p.upstream.clone(),
                upstream_model: None,
                weight: 1,
                thinking,
                default_max_tokens: p.default_max_tokens,
                hosted_tools: p.hosted_tools,
            }
        })
        .collect()
    }

    /// The request bodies of the fixture suite (`tests/fixtures`) in `protocol`'s words
    /// (`chat`, `messages` or `responses`): clients' requests and upstreams' requests.
    pub(crate) fn fixture_requests(protocol: &str) -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut out = Vec::new();
        for dir in std::fs::read_dir(&root).unwrap() {
            let dir = dir.unwrap().path();
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let Some((client, upstream)) = name.split_once("_to_") else {
                continue;
            };
            for case in std::fs::read_dir(&dir).unwrap() {
                let case = case.unwrap().path();
                for (side, file) in [
                    (client, "client_request.json"),
                    (upstream, "upstream_request.json"),
                ] {
                    if side == protocol {
                        if let Ok(text) = std::fs::read_to_string(case.join(file)) {
                            out.push(text);
                        }
                    }
                }
            }
        }
        assert!(out.len() > 20, "{protocol}: {} fixture bodies", out.len());
        out
    }
}
