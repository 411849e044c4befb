//! Request bodies for the benchmark: synthetic prompts of about `--input-tokens` words, or the lines of a `--dataset` JSONL file, in the protocol's shape.

use std::path::Path;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::Protocol;

/// Short, common English words: most tokenizers (BPE of the GPT, Llama, Qwen and Claude
/// families) encode each as one token with its leading space, so N words are about N tokens
/// (within some 10–20%). Exact counts would need the served model's tokenizer, which a client
/// pointed at any URL does not have.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "time", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "group", "country", "problem", "hand", "part", "place", "case",
    "week", "company", "system", "program", "question", "work", "number", "night", "point", "home",
    "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study",
    "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service",
    "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city",
    "name", "team", "minute", "idea", "kid", "body", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
    "education", "good", "new", "first", "last", "long", "great", "little", "own", "other", "old",
    "big", "high", "small", "large", "next", "early", "young", "few", "public", "bad", "same",
    "able", "make", "know", "take", "see", "come", "think", "look", "want", "give", "use", "find",
    "tell", "ask", "seem", "feel", "try", "leave", "call", "keep", "let", "begin", "help", "talk",
    "turn", "start", "show", "hear", "play", "run", "move", "like", "live", "hold", "bring",
    "write", "sit", "stand", "lose", "pay", "meet", "include", "set", "learn", "lead", "read",
    "grow", "open", "walk", "win", "offer", "love", "buy", "wait", "serve", "die", "send", "build",
    "stay", "fall", "cut", "reach", "kill", "raise", "pass", "sell", "decide", "return", "explain",
    "hope", "develop", "carry", "break", "receive",
];

/// Where request bodies come from.
#[derive(Debug, Clone)]
pub enum Source {
    Synthetic {
        input_tokens: usize,
        output_tokens: u64,
    },
    /// Parsed dataset lines (JSON objects), used in turn.
    Dataset {
        lines: Vec<Map<String, Value>>,
        output_tokens: u64,
    },
}

/// Builds the body of request number `i`.
#[derive(Debug, Clone)]
pub struct Bodies {
    pub protocol: Protocol,
    pub model: String,
    pub stream: bool,
    pub source: Source,
}

impl Bodies {
    pub fn body(&self, i: u64) -> Bytes {
        let value = match &self.source {
            Source::Synthetic {
                input_tokens,
                output_tokens,
            } => self.synthetic(&prompt(i, *input_tokens), *output_tokens),
            Source::Dataset {
                lines,
                output_tokens,
            } => {
                let idx = usize::try_from(i).unwrap_or(0) % lines.len().max(1);
                let line = lines.get(idx).cloned().unwrap_or_default();
                self.with_line(line, *output_tokens)
            }
        };
        Bytes::from(value.to_string())
    }

    fn synthetic(&self, prompt: &str, max: u64) -> Value {
        let mut v = match self.protocol {
            Protocol::Chat => json!({
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max,
            }),
            Protocol::Messages => json!({
                "model": self.model,
                "max_tokens": max,
                "messages": [{"role": "user", "content": prompt}],
            }),
            Protocol::Responses => json!({
                "model": self.model,
                "input": prompt,
                "max_output_tokens": max,
            }),
        };
        if let Value::Object(o) = &mut v {
            self.set_stream(o);
        }
        v
    }

    fn with_line(&self, mut line: Map<String, Value>, max: u64) -> Value {
        line.insert("model".into(), Value::String(self.model.clone()));
        // Anthropic requires max_tokens; a dataset written for another server may omit it.
        if self.protocol == Protocol::Messages && !line.contains_key("max_tokens") {
            line.insert("max_tokens".into(), json!(max));
        }
        self.set_stream(&mut line);
        Value::Object(line)
    }

    fn set_stream(&self, o: &mut Map<String, Value>) {
        o.insert("stream".into(), Value::Bool(self.stream));
        if self.protocol == Protocol::Chat {
            if self.stream {
                // Without it a chat stream carries no usage and output tokens are counted
                // deltas, which undercounts servers that put several tokens in one delta.
                if !o.contains_key("stream_options") {
                    o.insert("stream_options".into(), json!({"include_usage": true}));
                }
            } else {
                o.remove("stream_options");
            }
        }
    }
}

/// A prompt of `words` words, different for each `i` (so no prefix cache can serve one request
/// from another), the same for the same `i` on every run.
pub fn prompt(i: u64, words: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed);
    let mut out = String::with_capacity(words * 7);
    for n in 0..words {
        if n > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.usize(..WORDS.len())]);
    }
    out
}

/// Reads a JSONL dataset: every non-blank line must be a JSON object.
pub fn read_dataset(path: &Path) -> Result<Vec<Map<String, Value>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --dataset {}: {e}", path.display()))?;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(o)) => lines.push(o),
            Ok(_) => return Err(format!("{}:{}: not a JSON object", path.display(), n + 1)),
            Err(e) => return Err(format!("{}:{}: {e}", path.display(), n + 1)),
        }
    }
    if lines.is_empty() {
        return Err(format!("{}: no request bodies", path.display()));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_the_asked_word_count_and_differ() {
        assert_eq!(prompt(1, 50).split_whitespace().count(), 50);
        assert_ne!(prompt(1, 50), prompt(2, 50));
        assert_eq!(prompt(3, 20), prompt(3, 20));
        assert_eq!(prompt(3, 0), "");
    }

    #[test]
    fn bodies_take_the_protocols_shape() {
        let b = |protocol, stream| Bodies {
            protocol,
            model: "m".into(),
            stream,
            source: Source::Synthetic {
                input_tokens: 3,
                output_tokens: 7,
            },
        };
        let v: Value = serde_json::from_slice(&b(Protocol::Chat, true).body(0)).unwrap();
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream_options"]["include_usage"], true);
        let v: Value = serde_json::from_slice(&b(Protocol::Responses, false).body(0)).unwrap();
        assert_eq!(v["max_output_tokens"], 7);
        assert_eq!(v["stream"], false);
        let d = Bodies {
            protocol: Protocol::Messages,
            model: "over".into(),
            stream: true,
            source: Source::Dataset {
                lines: vec![serde_json::from_str(r#"{"model":"x","messages":[]}"#).unwrap()],
                output_tokens: 9,
            },
        };
        let v: Value = serde_json::from_slice(&d.body(5)).unwrap();
        assert_eq!(v["model"], "over");
        assert_eq!(v["max_tokens"], 9);
        assert_eq!(v["stream"], true);
    }
}
