//! A reply's `usage` object read straight into counts, in any protocol's words, with no `Value` tree: every JSON reply's usage is read for the access log and the metrics.
//!
//! It reads what `translate::{chat, messages, responses}::usage_from` read from a `Value`, the
//! same way (the lenient readers of `translate::lax` follow `Value::get`): a count that is not a
//! non-negative integer is absent, a `*_details` member that is not an object holds nothing,
//! and of a repeated key the last wins.

use crate::config::Protocol;
use crate::ir::Usage;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::translate::lax::{lax_struct, skip_seq};

/// Any JSON value, kept only when it is a non-negative integer (what `Loose::as_u64` reads):
/// an eighth of a `Loose`'s size, and the usage object is moved whole several times.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Count(Option<u64>);

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

lax_struct! {
    /// The counts a usage object may hold, in any protocol's words.
    pub(super) struct Counts<'a> {
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
    pub(super) fn object_at(text: &[u8]) -> Option<Counts<'_>> {
        if !text.starts_with(b"{") {
            return None;
        }
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
    pub(super) fn read_into(&self, protocol: Protocol, into: &mut Usage) {
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

#[cfg(test)]
mod tests {
    use super::*;
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
