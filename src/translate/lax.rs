//! Lenient, borrowing readers for client request bodies: each field keeps what the client sent (or that it was absent), so a decoder refuses a wrong type with its own 400 instead of a serde error, and no `serde_json::Value` tree is built.
//!
//! The rules are those of `Value::get`: a repeated key keeps its last value, and a value that is
//! not an object reads as an object with no fields. Unknown fields are skipped without being kept.
//! [`parse`] reads a body by hand first ([`super::hand`], whose reader `lax_struct!` writes for
//! each struct) and through serde when the hand reader is unsure: both find the same.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Number;

use super::hand::{self, Hand};
use crate::error::{ErrorKind, GatewayError};

/// One JSON value as the client sent it. Arrays keep their elements as `A` and objects are read
/// as `O`; the defaults skip what they hold, for fields that are scalars in the protocol.
#[derive(Debug, Default)]
pub enum Loose<'a, A = IgnoredAny, O = IgnoredAny> {
    #[default]
    Absent,
    Null,
    Bool(bool),
    Num(Number),
    Str(Cow<'a, str>),
    Arr(Vec<A>),
    Obj(O),
}

fn invalid(path: String, message: impl FnOnce(&str) -> String) -> GatewayError {
    let message = message(&path);
    GatewayError::invalid(path, message)
}

impl<'a, A, O> Loose<'a, A, O> {
    /// Absent or `null`: the protocols treat both as "not given".
    pub fn is_none(&self) -> bool {
        matches!(self, Self::Absent | Self::Null)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Self::Num(n) => n.as_u64(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[A]> {
        match self {
            Self::Arr(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&O> {
        match self {
            Self::Obj(o) => Some(o),
            _ => None,
        }
    }

    /// A string field; the path is only written out for the error.
    pub fn get_str(&self, path: impl FnOnce() -> String) -> Result<Option<&str>, GatewayError> {
        match self {
            Self::Absent | Self::Null => Ok(None),
            Self::Str(s) => Ok(Some(s)),
            _ => Err(invalid(path(), |p| format!("`{p}` must be a string"))),
        }
    }

    pub fn req_str(&self, path: impl Fn() -> String) -> Result<&str, GatewayError> {
        self.get_str(&path)?
            .ok_or_else(|| invalid(path(), |p| format!("`{p}` is required")))
    }

    pub fn get_bool(&self, path: impl FnOnce() -> String) -> Result<Option<bool>, GatewayError> {
        match self {
            Self::Absent | Self::Null => Ok(None),
            Self::Bool(b) => Ok(Some(*b)),
            _ => Err(invalid(path(), |p| format!("`{p}` must be a boolean"))),
        }
    }

    pub fn get_array(&self, path: impl FnOnce() -> String) -> Result<Option<&[A]>, GatewayError> {
        match self {
            Self::Absent | Self::Null => Ok(None),
            Self::Arr(a) => Ok(Some(a)),
            _ => Err(invalid(path(), |p| format!("`{p}` must be an array"))),
        }
    }

    /// A number in `[lo, hi]`; `key` is a top-level field and names the error.
    pub fn get_f64_in(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, GatewayError> {
        match self {
            Self::Absent | Self::Null => Ok(None),
            Self::Num(n) => {
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
            _ => Err(GatewayError::invalid(
                key,
                format!("`{key}` must be a number"),
            )),
        }
    }

    /// An integer of at least `min`; `key` names the error.
    pub fn get_u64(&self, key: &str, min: u64) -> Result<Option<u64>, GatewayError> {
        match self {
            Self::Absent | Self::Null => Ok(None),
            Self::Num(n) => match n.as_u64() {
                Some(x) if x >= min => Ok(Some(x)),
                _ => Err(GatewayError::invalid(
                    key,
                    format!("`{key}` must be an integer of at least {min}; got {n}"),
                )),
            },
            _ => Err(GatewayError::invalid(
                key,
                format!("`{key}` must be an integer"),
            )),
        }
    }
}

impl<O> Loose<'_, Loose<'_>, O> {
    /// The string list of a `stop`-like field: a string or an array of strings.
    pub fn string_list(&self, key: &str) -> Result<Vec<String>, GatewayError> {
        match self {
            Self::Absent | Self::Null => Ok(Vec::new()),
            Self::Str(s) => Ok(vec![s.clone().into_owned()]),
            Self::Arr(a) => a
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
            _ => Err(GatewayError::invalid(
                key,
                format!("`{key}` must be a string or an array of strings"),
            )),
        }
    }
}

impl<'de: 'a, 'a, A: Deserialize<'de>, O: Deserialize<'de>> Deserialize<'de> for Loose<'a, A, O> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LooseVisitor(PhantomData))
    }
}

struct LooseVisitor<'a, A, O>(PhantomData<fn() -> Loose<'a, A, O>>);

impl<'de: 'a, 'a, A: Deserialize<'de>, O: Deserialize<'de>> Visitor<'de>
    for LooseVisitor<'a, A, O>
{
    type Value = Loose<'a, A, O>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Loose::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Loose::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Loose::deserialize(d)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Loose::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Loose::Num(n.into()))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(Loose::Num(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Self::Value, E> {
        // What `Value` does with a float JSON cannot hold.
        Ok(Number::from_f64(n).map_or(Loose::Null, Loose::Num))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(s)))
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(Loose::Arr(out))
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Self::Value, M::Error> {
        O::deserialize(MapAccessDeserializer::new(map)).map(Loose::Obj)
    }
}

/// An array's first element, read as `T`; the elements after it are checked as serde checks
/// what it ignores, and dropped. Any other value is checked as a [`Loose`] reads it and holds
/// nothing. For a reply's or a chunk's `choices`, of which the gateway translates the first: a
/// `Loose` array is a `Vec`, an allocation per streamed chunk.
#[derive(Debug)]
pub struct First<T>(pub Option<T>);

// Not derived: a derive would ask `T: Default`, which an absent array does not need.
impl<T> Default for First<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<fn() -> T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
                let first = seq.next_element()?;
                skip_seq(seq)?;
                Ok(First(first))
            }
            fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Self::Value, M::Error> {
                // Read as a `Loose` reads an object it skips: keys as strings.
                IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
                Ok(First(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(First(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(First(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(First(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(First(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(First(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(First(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A value kept as its raw JSON text (a schema, a tool's input): `null` is kept as `null`,
/// unlike `Option<&RawValue>`, which would read it as absent.
#[derive(Debug, Default, Clone, Copy)]
pub struct Raw<'a>(pub Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Raw<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de RawValue>::deserialize(d).map(|r| Self(Some(r)))
    }
}

/// A value kept as its raw JSON text, as a `str` a hand reader can make too (a `RawValue` only
/// serde can).
#[derive(Debug, Default, Clone, Copy)]
pub struct RawText<'a>(pub Option<&'a str>);

impl<'de: 'a, 'a> Deserialize<'de> for RawText<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de RawValue>::deserialize(d).map(|r| Self(Some(r.get())))
    }
}

/// A field read twice: its raw text (echoed back to the client) and its typed reading.
#[derive(Debug, Default)]
pub struct Both<'a, T> {
    pub raw: Option<&'a RawValue>,
    pub typed: T,
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for Both<'a, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?;
        let typed = T::deserialize(&mut serde_json::Deserializer::from_str(raw.get()))
            .map_err(de::Error::custom)?;
        Ok(Self {
            raw: Some(raw),
            typed,
        })
    }
}

/// A field read once for both its text and its typed reading. A hand reader checks every byte
/// of what it reads, so the text is the span it read: no second walk, as [`Both`] needs for the
/// `RawValue` only serde can make (serde's read of it is [`Both`]'s).
#[derive(Debug, Default)]
pub struct Spanned<'a, T> {
    pub text: Option<&'a str>,
    pub typed: T,
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for Spanned<'a, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Both { raw, typed } = Both::<'a, T>::deserialize(d)?;
        Ok(Self {
            text: raw.map(RawValue::get),
            typed,
        })
    }
}

/// An object key, borrowed unless it holds escapes.
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// Skips a sequence's elements (for a lenient struct given an array).
pub fn skip_seq<'de, S: SeqAccess<'de>>(mut seq: S) -> Result<(), S::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Declares a wire struct read leniently: the named fields are read (a `= "key"` gives the JSON
/// key when it is not the field's name), every other key is skipped, the last of repeated keys
/// wins, and a value that is not an object gives the default (every field absent).
macro_rules! lax_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<'a> {
            $($fvis:vis $field:ident $(= $key:literal)? : $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name<'a> {
            $($fvis $field: $ty,)*
            _borrow: ::std::marker::PhantomData<&'a ()>,
        }

        impl<'de: 'a, 'a> ::serde::Deserialize<'de> for $name<'a> {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V<'a>(::std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> ::serde::de::Visitor<'de> for V<'a> {
                    type Value = $name<'a>;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        f.write_str("any JSON value")
                    }
                    fn visit_map<M: ::serde::de::MapAccess<'de>>(
                        self,
                        mut map: M,
                    ) -> Result<Self::Value, M::Error> {
                        let mut out = $name::default();
                        while let Some(key) = map.next_key::<$crate::translate::lax::Key<'_>>()? {
                            match &*key.0 {
                                $(lax_struct!(@key $field $($key)?) => out.$field = map.next_value()?,)*
                                _ => {
                                    map.next_value::<::serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                    fn visit_seq<S: ::serde::de::SeqAccess<'de>>(
                        self,
                        seq: S,
                    ) -> Result<Self::Value, S::Error> {
                        $crate::translate::lax::skip_seq(seq)?;
                        Ok($name::default())
                    }
                    fn visit_unit<E>(self) -> Result<Self::Value, E> {
                        Ok($name::default())
                    }
                    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                        Ok($name::default())
                    }
                    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                        Ok($name::default())
                    }
                    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                        Ok($name::default())
                    }
                    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                        Ok($name::default())
                    }
                    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                        Ok($name::default())
                    }
                }
                d.deserialize_any(V(::std::marker::PhantomData))
            }
        }

        impl<'a> $crate::translate::hand::Hand<'a> for $name<'a> {
            fn read(text: &'a str, at: usize, open: usize) -> Option<(Self, usize)> {
                let mut out = Self::default();
                let end = Self::fill(&mut out, text, at, open)?;
                Some((out, end))
            }

            fn read_into(slot: &mut Self, text: &'a str, at: usize, open: usize) -> Option<usize> {
                // A repeated key's value replaces the earlier one whole, as serde's read does.
                *slot = Self::default();
                Self::fill(slot, text, at, open)
            }

            fn read_fresh(slot: &mut Self, text: &'a str, at: usize, open: usize) -> Option<usize> {
                Self::fill(slot, text, at, open)
            }

            fn read_push(items: &mut Vec<Self>, text: &'a str, at: usize, open: usize) -> Option<usize> {
                items.push(Self::default());
                let slot = items.last_mut()?;
                Self::fill(slot, text, at, open)
            }
        }

        impl<'a> $name<'a> {
            /// The members of the value at `at` read into `out`, which holds the default.
            fn fill(out: &mut Self, text: &'a str, at: usize, open: usize) -> Option<usize> {
                $crate::translate::hand::lax_fill(out, text, at, open, |out: &mut Self, key, at| {
                    Self::member(out, text, key, at, open)
                })
            }

            /// Reads the member `key` of an object inside `open` containers, its value at
            /// `at`, into `out` (or skips it, checked, when it is none of this struct's);
            /// answers where the value ends.
            #[inline]
            fn member(out: &mut Self, text: &'a str, key: &[u8], at: usize, open: usize) -> Option<usize> {
                // Each member assigned as it comes leaves the last of a repeated key, as
                // serde's read does.
                $(if key == lax_struct!(@key $field $($key)?).as_bytes() {
                    return $crate::translate::hand::Hand::read_into(
                        &mut out.$field,
                        text,
                        at,
                        open + 1,
                    );
                })*
                $crate::json::walk::skip::<true>(text.as_bytes(), at, open + 1)
            }
        }
    };
    (@key $field:ident) => { stringify!($field) };
    (@key $field:ident $key:literal) => { $key };
}

pub(crate) use lax_struct;

fn not_json(e: &serde_json::Error) -> GatewayError {
    GatewayError::new(
        ErrorKind::InvalidRequest,
        format!("the request body is not valid JSON: {e}"),
    )
}

/// Parses a whole client body as `T`; only broken JSON fails here, with the message it always had.
pub fn parse<'a, T: Deserialize<'a> + Hand<'a>>(body: &'a [u8]) -> Result<T, GatewayError> {
    // One UTF-8 check of the whole body is cheaper than one per string, and it also covers the
    // strings of skipped fields, which a `Value` tree used to check.
    match std::str::from_utf8(body) {
        Ok(text) => match hand::object(text) {
            Some(value) => Ok(value),
            None => serde_json::from_str(text).map_err(|e| not_json(&e)),
        },
        // The slice reader names the line and column of the bad bytes, as it always did.
        Err(_) => match serde_json::from_slice::<serde_json::Value>(body) {
            Err(e) => Err(not_json(&e)),
            Ok(_) => Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                "the request body is not valid UTF-8",
            )),
        },
    }
}

/// Parses a client body that must be a JSON object.
pub fn parse_object<'a, T: Deserialize<'a> + Hand<'a>>(body: &'a [u8]) -> Result<T, GatewayError> {
    match parse::<Loose<'a, IgnoredAny, T>>(body)? {
        Loose::Obj(o) => Ok(o),
        _ => Err(GatewayError::invalid("body", "`body` must be an object")),
    }
}

/// Owned JSON text for the IR, from a constant the gateway writes itself.
pub fn raw_const(text: &'static str) -> Result<Box<RawValue>, GatewayError> {
    RawValue::from_string(text.to_owned()).map_err(|e| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("a built-in JSON constant: {e}"),
        )
    })
}
