//! A reply's `usage` object read straight into counts, in any protocol's words, with no `Value` tree: every JSON reply's usage is read for the access log and the metrics.
//!
//! It reads what `translate::{chat, messages, responses}::usage_from` read from a `Value`, the
//! same way: a count that is not a non-negative integer is absent (as `Value::as_u64` has it), a
//! `*_details` member that is not an object holds nothing, and of a repeated key the last wins.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::config::Protocol;
use crate::ir::Usage;

/// The visitor methods for every value that is neither an object nor a number: each yields
/// `$none`, an array's items read and dropped.
macro_rules! nothing_else {
    ($none:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($none)
        }
    };
}

/// [`nothing_else`], and integers yield `$none` too.
macro_rules! not_an_object {
    ($none:expr) => {
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($none)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($none)
        }
        nothing_else!($none);
    };
}

/// The counts a usage object may hold. `None`: absent, or not a count.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    /// `prompt_tokens_details`, `completion_tokens_details`, `input_tokens_details`,
    /// `output_tokens_details`.
    prompt: Details,
    completion: Details,
    input: Details,
    output: Details,
}

/// The members of a `*_details` object that any protocol reads.
#[derive(Debug, Default, PartialEq, Eq)]
struct Details {
    cached_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
    thinking_tokens: Option<u64>,
}

impl Counts {
    /// Adds what `protocol` reads from this object to `into`: chat and responses replace the
    /// usage, messages (whose stream splits it over two events) merges what is present.
    pub(super) fn read_into(&self, protocol: Protocol, into: &mut Usage) {
        let n = |v: Option<u64>| v.unwrap_or(0);
        match protocol {
            Protocol::Chat => {
                let cache_read = n(self.prompt.cached_tokens);
                let cache_write = n(self.prompt.cache_write_tokens);
                *into = Usage {
                    input: n(self.prompt_tokens)
                        .saturating_sub(cache_read.saturating_add(cache_write)),
                    cache_read,
                    cache_write,
                    output: n(self.completion_tokens),
                    reasoning: n(self.completion.reasoning_tokens),
                };
            }
            Protocol::Responses => {
                let cache_read = n(self.input.cached_tokens);
                let cache_write = n(self.input.cache_write_tokens);
                *into = Usage {
                    input: n(self.input_tokens)
                        .saturating_sub(cache_read.saturating_add(cache_write)),
                    cache_read,
                    cache_write,
                    output: n(self.output_tokens),
                    reasoning: n(self.output.reasoning_tokens),
                };
            }
            Protocol::Messages => {
                let set = |field: &mut u64, v: Option<u64>| {
                    if let Some(v) = v {
                        *field = v;
                    }
                };
                set(&mut into.input, self.input_tokens);
                set(&mut into.cache_read, self.cache_read_input_tokens);
                set(&mut into.cache_write, self.cache_creation_input_tokens);
                set(&mut into.output, self.output_tokens);
                set(&mut into.reasoning, self.output.thinking_tokens);
            }
        }
    }
}

/// A usage value: `Some` for an object, `None` for anything else (the search for a usage
/// object then goes on).
pub(super) struct UsageObject(pub(super) Option<Counts>);

impl<'de> Deserialize<'de> for UsageObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UsageObject;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a usage object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageObject, A::Error> {
                let mut c = Counts::default();
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    let count = |map: &mut A| map.next_value::<Count>().map(|c| c.0);
                    let details = |map: &mut A| map.next_value::<DetailsValue>().map(|d| d.0);
                    match key.0.as_ref() {
                        "prompt_tokens" => c.prompt_tokens = count(&mut map)?,
                        "completion_tokens" => c.completion_tokens = count(&mut map)?,
                        "input_tokens" => c.input_tokens = count(&mut map)?,
                        "output_tokens" => c.output_tokens = count(&mut map)?,
                        "cache_read_input_tokens" => c.cache_read_input_tokens = count(&mut map)?,
                        "cache_creation_input_tokens" => {
                            c.cache_creation_input_tokens = count(&mut map)?
                        }
                        "prompt_tokens_details" => c.prompt = details(&mut map)?,
                        "completion_tokens_details" => c.completion = details(&mut map)?,
                        "input_tokens_details" => c.input = details(&mut map)?,
                        "output_tokens_details" => c.output = details(&mut map)?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(UsageObject(Some(c)))
            }
            not_an_object!(UsageObject(None));
        }
        d.deserialize_any(V)
    }
}

/// A `*_details` value: its counts when it is an object, none otherwise.
struct DetailsValue(Details);

impl<'de> Deserialize<'de> for DetailsValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DetailsValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a details object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DetailsValue, A::Error> {
                let mut d = Details::default();
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    let slot = match key.0.as_ref() {
                        "cached_tokens" => &mut d.cached_tokens,
                        "cache_write_tokens" => &mut d.cache_write_tokens,
                        "reasoning_tokens" => &mut d.reasoning_tokens,
                        "thinking_tokens" => &mut d.thinking_tokens,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = map.next_value::<Count>()?.0;
                }
                Ok(DetailsValue(d))
            }
            not_an_object!(DetailsValue(Details::default()));
        }
        d.deserialize_any(V)
    }
}

/// A count as `Value::as_u64` reads it: a non-negative integer, else nothing.
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a count")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
                Ok(Count(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Count, E> {
                Ok(Count(u64::try_from(v).ok()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Count(None))
            }
            nothing_else!(Count(None));
        }
        d.deserialize_any(V)
    }
}

/// A key, borrowed when it has no escapes (almost always), owned otherwise.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// What the translation's own readers make of `u`.
    fn by_value(protocol: Protocol, u: &Value) -> Usage {
        let mut usage = Usage {
            input: 7,
            cache_read: 7,
            cache_write: 7,
            output: 7,
            reasoning: 7,
        };
        match protocol {
            Protocol::Chat => usage = crate::translate::chat::usage_from(u),
            Protocol::Messages => crate::translate::messages::usage_from(u, &mut usage),
            Protocol::Responses => usage = crate::translate::responses::usage_from(u),
        }
        usage
    }

    fn by_counts(protocol: Protocol, text: &str) -> Usage {
        let mut usage = Usage {
            input: 7,
            cache_read: 7,
            cache_write: 7,
            output: 7,
            reasoning: 7,
        };
        let UsageObject(Some(c)) = serde_json::from_str::<UsageObject>(text).unwrap() else {
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
        for text in ["null", "3", "\"x\"", "[1,{\"a\":2}]", "true"] {
            assert!(
                serde_json::from_str::<UsageObject>(text)
                    .unwrap()
                    .0
                    .is_none(),
                "{text}"
            );
        }
    }
}
