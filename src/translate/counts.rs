//! A reply's `usage` object read straight into counts, in any protocol's words, with no `Value` tree: every JSON reply's usage is read for the access log and the metrics, and a chat reply's for its translation.
//!
//! It reads what `translate::{chat, messages, responses}::usage_from` read from a `Value`, the
//! same way (the lenient readers of `translate::lax` follow `Value::get`): a count that is not a
//! non-negative integer is absent, a `*_details` member that is not an object holds nothing,
//! and of a repeated key the last wins.
//!
//! The plain object every upstream writes is read by hand, and anything the hand reader is not
//! sure of by serde, so that both find the same counts (the tests hold them to it).

use crate::config::Protocol;
use crate::ir::Usage;
use crate::json::walk::{self, object};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::translate::hand::Hand;
use crate::translate::lax::{lax_struct, skip_seq, Loose};

/// Any JSON value, kept only when it is a non-negative integer (what `Loose::as_u64` reads):
/// an eighth of a `Loose`'s size, and the usage object is moved whole several times.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Count(Option<u64>);

impl Count {
    fn as_u64(self) -> Option<u64> {
        self.0
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
                Ok(Count(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Count, E> {
                Ok(Count(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_unit<E>(self) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_seq<S: SeqAccess<'de>>(self, seq: S) -> Result<Count, S::Error> {
                skip_seq(seq)?;
                Ok(Count(None))
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Count, M::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Count(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'a> Hand<'a> for Count {
    fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
        // What serde's visitor above keeps of each kind of value is what `Loose::as_u64` keeps.
        let (value, end) = <Loose<'a>>::read(text, at, open)?;
        Some((Count(value.as_u64()), end))
    }
}

lax_struct! {
    /// The counts a usage object may hold, in any protocol's words.
    pub(crate) struct Counts<'a> {
        prompt_tokens: Count,
        completion_tokens: Count,
        input_tokens: Count,
        output_tokens: Count,
        cache_read_input_tokens: Count,
        cache_creation_input_tokens: Count,
        prompt = "prompt_tokens_details": Details<'a>,
        completion = "completion_tokens_details": Details<'a>,
        input = "input_tokens_details": Details<'a>,
        output = "output_tokens_details": Details<'a>,
    }
}

lax_struct! {
    /// The members of a `*_details` object that any protocol reads.
    struct Details<'a> {
        cached_tokens: Count,
        cache_write_tokens: Count,
        reasoning_tokens: Count,
        thinking_tokens: Count,
    }
}

impl Counts<'_> {
    /// Reads the usage object at the start of `text` (what follows it is not looked at);
    /// `None` when it is not an object or not JSON.
    pub(crate) fn object_at(text: &[u8]) -> Option<Counts<'_>> {
        if !text.starts_with(b"{") {
            return None;
        }
        // Every JSON reply comes here: serde's visitors cost several times the hand reader.
        Self::by_hand(text).or_else(|| Self::by_serde(text))
    }

    /// [`Self::object_at`] as serde reads it, for what the hand reader is unsure of.
    fn by_serde(text: &[u8]) -> Option<Counts<'_>> {
        // The text runs from the object to the reply's end: UTF-8 unless the reply is not, so
        // it is checked once, whole, rather than string by string as bytes would be.
        match std::str::from_utf8(text) {
            Ok(text) => Self::first(serde_json::Deserializer::from_str(text)),
            Err(_) => Self::first(serde_json::Deserializer::from_slice(text)),
        }
    }

    /// The first value `de` reads, if it reads as counts; what follows it is left unread.
    fn first<'de, R: serde_json::de::Read<'de>>(
        de: serde_json::Deserializer<R>,
    ) -> Option<Counts<'de>> {
        de.into_iter::<Counts<'de>>().next()?.ok()
    }

    /// Adds what `protocol` reads from this object to `into`: chat and responses replace the
    /// usage, messages (whose stream splits it over two events) merges what is present.
    pub(crate) fn read_into(&self, protocol: Protocol, into: &mut Usage) {
        let n = |v: &Count| v.as_u64().unwrap_or(0);
        // Chat and responses both count cache reads and writes inside the prompt's total.
        let replace = |prompt: &Count, details: &Details<'_>, output: &Count, reasoning| {
            let cache_read = n(&details.cached_tokens);
            let cache_write = n(&details.cache_write_tokens);
            Usage {
                input: n(prompt).saturating_sub(cache_read.saturating_add(cache_write)),
                cache_read,
                cache_write,
                output: n(output),
                reasoning: n(reasoning),
            }
        };
        match protocol {
            Protocol::Chat => {
                *into = replace(
                    &self.prompt_tokens,
                    &self.prompt,
                    &self.completion_tokens,
                    &self.completion.reasoning_tokens,
                );
            }
            Protocol::Responses => {
                *into = replace(
                    &self.input_tokens,
                    &self.input,
                    &self.output_tokens,
                    &self.output.reasoning_tokens,
                );
            }
            Protocol::Messages => {
                let set = |field: &mut u64, v: &Count| {
                    if let Some(v) = v.as_u64() {
                        *field = v;
                    }
                };
                set(&mut into.input, &self.input_tokens);
                set(&mut into.cache_read, &self.cache_read_input_tokens);
                set(&mut into.cache_write, &self.cache_creation_input_tokens);
                set(&mut into.output, &self.output_tokens);
                set(&mut into.reasoning, &self.output.thinking_tokens);
            }
        }
    }
}

// The hand reader, for the plain usage object every upstream writes, walks the text with
// `json::walk` without its `UTF8` mode (the text may be the tail of a reply that is not UTF-8).
// What it accepts serde accepts, and anything unusual (a `-` or a fraction where a count may
// be, a `\u` escape or a byte past ASCII, an escaped key, deep nesting) is left to serde, which
// also names every text that is no object as such.

impl Counts<'_> {
    /// The counts of the object at the start of `text`, when the hand reader is sure of them.
    fn by_hand(text: &[u8]) -> Option<Counts<'_>> {
        let mut out = Counts::default();
        // Assigning each member as it comes leaves the last of a repeated key, as serde does.
        // Keys are compared whole (a word or two at a time), not by slice patterns (a byte at
        // a time).
        object::<false>(text, 0, |key, at| match key {
            k if k == b"prompt_tokens" => count(text, at, 1, &mut out.prompt_tokens),
            k if k == b"completion_tokens" => count(text, at, 1, &mut out.completion_tokens),
            k if k == b"input_tokens" => count(text, at, 1, &mut out.input_tokens),
            k if k == b"output_tokens" => count(text, at, 1, &mut out.output_tokens),
            k if k == b"cache_read_input_tokens" => {
                count(text, at, 1, &mut out.cache_read_input_tokens)
            }
            k if k == b"cache_creation_input_tokens" => {
                count(text, at, 1, &mut out.cache_creation_input_tokens)
            }
            k if k == b"prompt_tokens_details" => details(text, at, &mut out.prompt),
            k if k == b"completion_tokens_details" => details(text, at, &mut out.completion),
            k if k == b"input_tokens_details" => details(text, at, &mut out.input),
            k if k == b"output_tokens_details" => details(text, at, &mut out.output),
            _ => walk::skip::<false>(text, at, 1),
        })?;
        Some(out)
    }
}

/// Reads a `*_details` member's value at `i` into `into`: an object's counts, or nothing for
/// any other value.
fn details(b: &[u8], i: usize, into: &mut Details<'_>) -> Option<usize> {
    // The whole value is replaced, as serde replaces it when the key repeats.
    *into = Details::default();
    if b.get(i) != Some(&b'{') {
        // Serde reads it as any value: a number must be one it reads without error.
        return count(b, i, 1, &mut Count::default());
    }
    object::<false>(b, i, |key, at| match key {
        k if k == b"cached_tokens" => count(b, at, 2, &mut into.cached_tokens),
        k if k == b"cache_write_tokens" => count(b, at, 2, &mut into.cache_write_tokens),
        k if k == b"reasoning_tokens" => count(b, at, 2, &mut into.reasoning_tokens),
        k if k == b"thinking_tokens" => count(b, at, 2, &mut into.thinking_tokens),
        _ => walk::skip::<false>(b, at, 2),
    })
}

/// Reads a value where serde reads any JSON value, at `i` inside `open` containers, into
/// `into`: an integer that is a u64 counts, any other value is skipped and counts nothing.
fn count(b: &[u8], i: usize, open: usize, into: &mut Count) -> Option<usize> {
    match b.get(i)? {
        b'0'..=b'9' => {
            let (n, end) = integer(b, i)?;
            *into = Count(Some(n));
            Some(end)
        }
        // Negative and oversized integers, fractions and exponents are read by serde as i64 or
        // f64, and an f64 out of range fails the whole object: serde decides.
        b'-' => None,
        _ => {
            *into = Count(None);
            walk::skip::<false>(b, i, open)
        }
    }
}

/// The `0` or `[1-9][0-9]*` at `i`, when it is a whole number that fits in u64 (what serde
/// reads as u64), and where it ends.
fn integer(b: &[u8], i: usize) -> Option<(u64, usize)> {
    let mut n: u64 = 0;
    let mut end = i;
    while let Some(&d @ b'0'..=b'9') = b.get(end) {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        end += 1;
    }
    let leading_zero = end - i > 1 && b.get(i) == Some(&b'0');
    if end == i || leading_zero || matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    Some((n, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::hand::check;
    use serde_json::{json, Value};

    /// A usage already holding counts, so a reader that merges shows what it left alone.
    const SEVENS: Usage = Usage {
        input: 7,
        cache_read: 7,
        cache_write: 7,
        output: 7,
        reasoning: 7,
    };

    /// What the translation's own readers make of `u`.
    fn by_value(protocol: Protocol, u: &Value) -> Usage {
        let mut usage = SEVENS;
        match protocol {
            Protocol::Chat => usage = crate::translate::chat::usage_from(u),
            Protocol::Messages => crate::translate::messages::usage_from(u, &mut usage),
            Protocol::Responses => usage = crate::translate::responses::usage_from(u),
        }
        usage
    }

    fn by_counts(protocol: Protocol, text: &str) -> Usage {
        let mut usage = SEVENS;
        let Some(c) = Counts::object_at(text.as_bytes()) else {
            panic!("not read as an object: {text}");
        };
        c.read_into(protocol, &mut usage);
        usage
    }

    #[test]
    fn counts_read_as_the_translation_reads_the_value() {
        let cases = [
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 1},
                "completion_tokens_details": {"reasoning_tokens": 2}}),
            json!({"input_tokens": 30, "output_tokens": 9, "cache_read_input_tokens": 3,
                "cache_creation_input_tokens": 2, "output_tokens_details": {"thinking_tokens": 6}}),
            json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 5},
                "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 1}}),
            json!({"output_tokens": 3}),
            json!({}),
            // Counts that are not counts, and details that are not objects.
            json!({"prompt_tokens": -1, "completion_tokens": 2.5, "input_tokens": "9",
                "output_tokens": null, "prompt_tokens_details": [1, {"cached_tokens": 3}],
                "input_tokens_details": null, "output_tokens_details": 4,
                "completion_tokens_details": {"reasoning_tokens": {"n": 1}},
                "cache_read_input_tokens": [], "cache_creation_input_tokens": true}),
            json!({"prompt_tokens": u64::MAX, "prompt_tokens_details": {"cached_tokens": u64::MAX},
                "extra": {"nested": [{"prompt_tokens": 1}]}, "completion_tokens": 1}),
        ];
        for case in &cases {
            let text = case.to_string();
            for protocol in [Protocol::Chat, Protocol::Messages, Protocol::Responses] {
                assert_eq!(
                    by_counts(protocol, &text),
                    by_value(protocol, case),
                    "{protocol:?} {text}"
                );
            }
        }
    }

    #[test]
    fn the_last_of_a_repeated_key_wins_as_in_a_value() {
        let text = r#"{"prompt_tokens": 1, "prompt_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 3},
            "prompt_tokens_details": {"cache_write_tokens": 2}}"#;
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            by_counts(Protocol::Chat, text),
            by_value(Protocol::Chat, &v)
        );
        assert_eq!(by_counts(Protocol::Chat, text).cache_read, 0);
    }

    /// Whether the hand reader answered for `text`; when it did, it found what serde finds,
    /// field for field and in every protocol's reading. Whatever it did, `object_at` answers
    /// as serde does.
    fn agrees(text: &[u8]) -> bool {
        let shown = String::from_utf8_lossy(text);
        let serde = Counts::by_serde(text).filter(|_| text.starts_with(b"{"));
        assert_eq!(
            format!("{:?}", Counts::object_at(text)),
            format!("{serde:?}"),
            "{shown}"
        );
        let Some(quick) = Counts::by_hand(text) else {
            return false;
        };
        let Some(serde) = serde else {
            panic!("the hand reader read what serde refuses: {shown}");
        };
        assert_eq!(format!("{quick:?}"), format!("{serde:?}"), "{shown}");
        for protocol in [Protocol::Chat, Protocol::Messages, Protocol::Responses] {
            let (mut by_hand, mut by_serde) = (SEVENS, SEVENS);
            quick.read_into(protocol, &mut by_hand);
            serde.read_into(protocol, &mut by_serde);
            assert_eq!(by_hand, by_serde, "{protocol:?} {shown}");
        }
        true
    }

    #[test]
    fn what_upstreams_write_takes_the_hand_reader() {
        let objects = [
            r#"{"prompt_tokens":40,"completion_tokens":20,"total_tokens":60}}"#,
            r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_1"}"#,
            r#"{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":12,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":12,"service_tier":"standard","server_tool_use":null}}"#,
            r#"{"input_tokens":40,"input_tokens_details":{"cached_tokens":0},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":60},"user":null,"metadata":{}}"#,
            "{\n  \"prompt_tokens\" : 5 ,\r\n\t\"completion_tokens\":\t6\n}\n",
            r#"{"output_tokens":30}}\n\n"#,
            "{}",
            "{ }",
            // What follows the object is not looked at, whatever it is.
            "{\"prompt_tokens\":1} garbage \u{1} \"",
        ];
        for text in objects {
            assert!(agrees(text.as_bytes()), "left to serde: {text}");
        }
        let mut after = br#"{"prompt_tokens":2}"#.to_vec();
        after.extend_from_slice(b"\xff\xfe");
        assert!(agrees(&after));
    }

    /// What serde reads as a count, checked rather than assumed: the hand reader must agree.
    #[test]
    fn a_count_is_what_serde_reads_as_a_u64() {
        // `None`: the object is refused; `Some(None)`: read, and the count absent.
        let cases: &[(&str, Option<Option<u64>>)] = &[
            ("0", Some(Some(0))),
            ("40", Some(Some(40))),
            ("18446744073709551615", Some(Some(u64::MAX))),
            ("18446744073709551616", Some(None)),
            ("123456789012345678901234567890", Some(None)),
            ("-0", Some(None)),
            ("-1", Some(None)),
            ("-9223372036854775809", Some(None)),
            ("1.0", Some(None)),
            ("0.5", Some(None)),
            ("1e2", Some(None)),
            ("1E+2", Some(None)),
            ("-1e-2", Some(None)),
            ("\"5\"", Some(None)),
            ("true", Some(None)),
            ("null", Some(None)),
            ("[3]", Some(None)),
            ("{\"n\":3}", Some(None)),
            // Skipped inside a container, a number is only checked to be one.
            ("[1e400, -0, 18446744073709551616]", Some(None)),
            ("{\"n\":1e400}", Some(None)),
            // Read as a number where a count may be, an f64 out of range fails the object.
            ("1e400", None),
            (&"9".repeat(400), None),
            ("01", None),
            ("1.", None),
            ("-", None),
            ("+1", None),
            (".5", None),
            ("1e", None),
            ("tru", None),
            ("\"\\u12\"", None),
            ("\"a\u{1}\"", None),
        ];
        for (value, want) in cases {
            for text in [
                format!("{{\"prompt_tokens\":{value}}}"),
                format!("{{\"prompt_tokens_details\":{{\"cached_tokens\":{value}}}}}"),
            ] {
                let got = |c: Option<Counts<'_>>| {
                    c.map(|c| c.prompt_tokens.as_u64().or(c.prompt.cached_tokens.as_u64()))
                };
                assert_eq!(
                    got(Counts::by_serde(text.as_bytes())),
                    *want,
                    "serde: {text}"
                );
                assert_eq!(got(Counts::object_at(text.as_bytes())), *want, "{text}");
                agrees(text.as_bytes());
                // The translation's generic hand reader reads the same type.
                assert_eq!(
                    check::agrees::<Counts<'_>>(text.as_bytes()),
                    want.is_some(),
                    "{text}"
                );
            }
            // Details that are not an object hold nothing, but are read as any value.
            let text = format!("{{\"prompt_tokens_details\":{value}}}");
            let refused = want.is_none();
            assert_eq!(
                Counts::object_at(text.as_bytes()).is_none(),
                refused,
                "{text}"
            );
            agrees(text.as_bytes());
        }
    }

    #[test]
    fn tricky_objects_are_read_as_serde_reads_them() {
        let deep = |n: usize| format!("{{\"x\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        let taken = [
            r#"{"x":"esc \" \\ \/ \b \f \n \r \t","prompt_tokens":3}"#.to_owned(),
            r#"{"x":"a \"usage\": {\"prompt_tokens\": 999}","completion_tokens":4}"#.to_owned(),
            r#"{"prompt_tokens":1,"prompt_tokens":8,"prompt_tokens":"x"}"#.to_owned(),
            r#"{"prompt_tokens_details":{"cached_tokens":3},"prompt_tokens_details":{"cache_write_tokens":2}}"#.to_owned(),
            r#"{"input_tokens_details":{"cached_tokens":1,"cached_tokens":2,"x":[{"cached_tokens":5}]}}"#.to_owned(),
            r#"{"usage":{"prompt_tokens":9},"prompt_tokens":2}"#.to_owned(),
            " { \"output_tokens\" \n:\n 7 \t, \"x\" : [ 1 , { \"a\" : [ ] } , true , false , null ] } ".trim_start().to_owned(),
            r#"{"output_tokens_details":{"thinking_tokens":6,"reasoning_tokens":"-1"},"output_tokens":{}}"#.to_owned(),
            // The object and 63 arrays: `DEEPEST` containers open at once.
            deep(63),
        ];
        for text in &taken {
            assert!(agrees(text.as_bytes()), "left to serde: {text}");
        }
        let left = [
            r#"{"x":"héllo — 日本 😀","output_tokens":1}"#.to_owned(),
            r#"{"é":1,"output_tokens":2}"#.to_owned(),
            r#"{"x":"\u00e9","prompt_tokens":3}"#.to_owned(),
            r#"{"x":"\ud800","prompt_tokens":3}"#.to_owned(),
            r#"{"prompt\u005ftokens":3}"#.to_owned(),
            r#"{"prompt_tokens\n":3}"#.to_owned(),
            r#"{"prompt_tokens":-2}"#.to_owned(),
            "{\"x\":\"tab\tin\",\"prompt_tokens\":3}".to_owned(),
            "{\"x\":\"nul\u{0}\"}".to_owned(),
            "{\"x\":\"unit separator \u{1f}\"}".to_owned(),
            "{\"x\":[\"\u{10}\"]}".to_owned(),
            r#"{"x":"\q"}"#.to_owned(),
            r#"{"prompt_tokens":3"#.to_owned(),
            r#"{"prompt_tokens":3,"#.to_owned(),
            r#"{"prompt_tokens":3,}"#.to_owned(),
            r#"{"prompt_tokens" 3}"#.to_owned(),
            r#"{"prompt_tokens":3 "x":1}"#.to_owned(),
            r#"{"x":[1,]}"#.to_owned(),
            r#"{"x":[1}"#.to_owned(),
            r#"{"x":{"a"}}"#.to_owned(),
            r#"{"x":{1:2}}"#.to_owned(),
            r#"{'x':1}"#.to_owned(),
            r#"{"x":nulll}"#.to_owned(),
            r#"{"x":"unterminated}"#.to_owned(),
            deep(64),
            deep(127),
            deep(200),
        ];
        for text in taken.iter().chain(&left) {
            check::agrees::<Counts<'_>>(text.as_bytes());
        }
        for text in &left {
            assert!(!agrees(text.as_bytes()), "the hand reader answered: {text}");
        }
        // Bytes past ASCII inside the object, UTF-8 or not, met in a whole word or a last few
        // bytes, are serde's to read.
        for bad in [&b"\xff"[..], b"\xc3", b"\xed\xa0\x80", b"\xc3\xa9", b"\x80"] {
            for (before, after) in [("", ""), ("", "12345678"), ("1234567", ""), ("12", "3")] {
                let mut text = format!(r#"{{"x":"{before}"#).into_bytes();
                text.extend_from_slice(bad);
                text.extend_from_slice(format!(r#"{after}","output_tokens":3}}"#).as_bytes());
                assert!(!agrees(&text), "{bad:?}");
            }
        }
    }

    /// Every one-piece edit of usage objects (a piece inserted, a byte replaced or dropped), so
    /// the hand reader meets objects one step from valid everywhere: it answers for some, and
    /// must agree with serde on each.
    #[test]
    fn one_edit_from_valid_the_hand_reader_still_agrees() {
        let objects = [
            r#"{"prompt_tokens":40,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":4},"x":[1,{"y":"a\"b"}]}"#,
            r#"{"input_tokens":1,"output_tokens_details":{"thinking_tokens":2,"reasoning_tokens":3},"cache_read_input_tokens":0,"t":null}"#,
        ];
        let mut answered = 0;
        for text in objects {
            for at in 0..=text.len() {
                for piece in PIECES {
                    let mut edited = text.as_bytes().to_vec();
                    edited.splice(at..at, piece.bytes());
                    answered += usize::from(agrees(&edited));
                    if at < text.len() {
                        let mut replaced = text.as_bytes().to_vec();
                        replaced.splice(at..=at, piece.bytes());
                        answered += usize::from(agrees(&replaced));
                    }
                }
                if at < text.len() {
                    let mut dropped = text.as_bytes().to_vec();
                    dropped.remove(at);
                    answered += usize::from(agrees(&dropped));
                }
            }
        }
        assert!(
            answered > 1000,
            "the hand reader answered for only {answered}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(1024))]

        /// Usage objects made of likely and unlikely members, then edited byte by byte: the
        /// hand reader never answers otherwise than serde.
        #[test]
        fn the_hand_reader_never_answers_otherwise_than_serde(
            members in proptest::collection::vec(
                (0..KEYS.len(), 0..=VALUES.len(), 0..SPACES.len()), 0..8),
            inner in proptest::collection::vec(
                (0..KEYS.len(), 0..VALUES.len(), 0..SPACES.len()), 0..5),
            edits in proptest::collection::vec((0usize..400, 0u8..3, 0..PIECES.len()), 0..3),
        ) {
            let object = |members: &[(usize, usize, usize)], inner: &str| {
                let body = members
                    .iter()
                    .map(|&(k, v, s)| {
                        let value = VALUES.get(v).copied().unwrap_or(inner);
                        let space = SPACES[s];
                        format!("{space}\"{}\"{space}:{space}{value}{space}", KEYS[k])
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                format!("{{{body}}}")
            };
            let inner = object(&inner, "{}");
            let mut text = object(&members, &inner).into_bytes();
            agrees(&text);
            for (at, op, piece) in edits {
                let at = at % (text.len() + 1);
                let piece = PIECES[piece].as_bytes();
                match op {
                    0 => drop(text.splice(at..at, piece.iter().copied())),
                    1 if at < text.len() => drop(text.splice(at..=at, piece.iter().copied())),
                    _ if at < text.len() => drop(text.remove(at)),
                    _ => {}
                }
                agrees(&text);
            }
        }
    }

    #[rustfmt::skip]
    const KEYS: &[&str] = &[
        "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
        "cache_read_input_tokens", "cache_creation_input_tokens", "prompt_tokens_details",
        "completion_tokens_details", "input_tokens_details", "output_tokens_details",
        "cached_tokens", "cache_write_tokens", "reasoning_tokens", "thinking_tokens",
        "total_tokens", "x", "prompt\\u005ftokens", "é", "",
    ];

    #[rustfmt::skip]
    const VALUES: &[&str] = &[
        "0", "7", "40", "18446744073709551615", "18446744073709551616", "-0", "-3", "1.5",
        "2e3", "1e400", "01", "\"9\"", "\"a\\\"b\\\\c\\/\\n\"", "\"\\u00e9\"", "\"é\"", "true",
        "false", "null", "[]", "[1,[2,{\"k\":-1.5e-3}]]", "{}", "{\"cached_tokens\":3}",
        "{\"reasoning_tokens\":5,\"cached_tokens\":\"x\",\"thinking_tokens\":[1]}",
        "{\"cache_write_tokens\":2,\"other\":{\"cached_tokens\":9}}",
    ];

    const SPACES: &[&str] = &["", " ", "\n  ", "\t", "\r\n"];

    #[rustfmt::skip]
    const PIECES: &[&str] = &[
        "\"a\"", ":", ",", "{", "}", "[", "]", " ", "\n", "1", "-", "0", ".", "5", "e", "+",
        "true", "null", "fals", "\"x\\\"y\"", "\"\\u00e9\"", "\"\\q\"", "\t", "\"", "\\", "\"é\"",
        "\"\u{1}\"", "01", "\"prompt_tokens\":", "\u{1}", "\u{10}", "\u{1f}", "\u{7f}", "\u{80}", "\u{ff}",
        "18446744073709551616",
    ];

    #[test]
    fn anything_but_an_object_is_no_usage() {
        for text in [
            "null",
            "3",
            "\"x\"",
            "[1,{\"a\":2}]",
            "true",
            "{\"a\":",
            "{\"a\" 1}",
        ] {
            assert!(Counts::object_at(text.as_bytes()).is_none(), "{text}");
        }
    }
}
