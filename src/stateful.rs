//! Stateful Responses (gateway.md §13): what `/v1/responses` serves is kept per key, so `previous_response_id`, `item_reference` and `GET`/`DELETE /v1/responses/{id}` work whatever protocol the upstream speaks.
//!
//! Two kinds of record, both under the key that made them (another key's id is simply absent):
//! - a translated response (chat or messages upstream, or the built-in mock): the gateway is the
//!   only one that knows it, so it keeps the response object as served and the request's input
//!   items (after expansion), and indexes the ids of the items it holds for `item_reference`,
//!   but for the ids the gateway gave them, which name the response that made them
//!   ([`ir::ItemIds`]: its output items' and the input items it completed, [`InputIds`]);
//! - a passthrough response (a responses upstream): the upstream keeps it; the gateway only
//!   remembers which upstream, so reads, deletes and follow-up turns go back there.
//!
//! `item_reference` is resolved by the id's own answer or a per-key item index (item id →
//! response id) rather than only within the `previous_response_id` chain, because the AI SDK
//! sends references with its whole history and no `previous_response_id` at all.

use std::borrow::Cow;
use std::future::Future as _;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
// The maps here hold one request's item ids, hashed several times each for a long history:
// foldhash, seeded per process, takes a fraction of SipHash's instructions for an id.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use http::{HeaderValue, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::body::{self, Body, BoxError};
use crate::config::StoreSettings;
use crate::error::{ErrorKind, GatewayError};
use crate::ir;
use crate::json::RawObject;
use crate::sse::{EventRef, EventTooLarge, SseDecoder};
use crate::store::{RedisStore, StoreError};
use crate::translate::hand;
use crate::translate::lax::{self, lax_struct, Loose, Spanned};
use crate::translate::responses::{Final, FinalSlot};

/// Ids longer than this are nobody's: they are refused as unknown before reaching a store key.
const MAX_ID_LEN: usize = 256;

/// Whether `id` can be a key's entry: others are nobody's.
fn storable(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN
}

/// What is kept for one response id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// Served by translation: the response object as the client got it, and its input items.
    Translated { response: Value, input: Vec<Value> },
    /// Served by a responses upstream, which keeps it itself.
    Passthrough { upstream: String },
}

/// Where stored responses live: this process (bounded by bytes) or the limits' Redis.
pub struct ResponseStore {
    backend: Backend,
    ttl: Duration,
    /// Set while a tidy-up of the in-process store is queued ([`Self::tidy_soon`]).
    tidy_queued: Arc<AtomicBool>,
}

enum Backend {
    Local(moka::future::Cache<String, Arc<Entry>>),
    Redis(Arc<RedisStore>),
}

/// One entry as the store gives it back: a record's text, or the id of the response an item
/// id points at. A translated record also comes with where its items lie ([`RecordIndex`]), kept
/// beside it in process or in Redis, so continuing from it does not read its history again; one
/// without (a passthrough record, or one an earlier version wrote to Redis) is read.
#[derive(Debug)]
struct Entry {
    text: String,
    index: Option<RecordIndex>,
}

impl Entry {
    fn text(text: String) -> Arc<Self> {
        Arc::new(Self { text, index: None })
    }

    /// What the entry holds in bytes, for the in-process store's cap.
    fn weight(&self) -> usize {
        let index = self.index.as_ref().map_or(0, |i| {
            let heads: usize = (i.input.iter()).map(|(_, h)| h.heap_len()).sum();
            i.input.len() * std::mem::size_of::<(Range<usize>, Head)>() + heads
        });
        self.text.len() + index
    }
}

/// The kinds of entry: a response record, an item id pointing at the response that holds it,
/// and (in Redis only; in process it is kept in the record's entry) a record's index.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Response,
    Item,
    Index,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Response => "resp",
            Self::Item => "item",
            Self::Index => "resp-index",
        }
    }
}

impl ResponseStore {
    /// In Redis when the limits use one (sharing its connection), else in this process.
    pub fn new(settings: &StoreSettings, redis: Option<Arc<RedisStore>>) -> Self {
        let backend = match redis {
            Some(r) => Backend::Redis(r),
            None => Backend::Local(
                moka::future::Cache::builder()
                    .max_capacity(settings.responses_max_bytes)
                    .weigher(|k: &String, v: &Arc<Entry>| {
                        u32::try_from(k.len() + v.weight()).unwrap_or(u32::MAX)
                    })
                    .time_to_live(settings.responses_ttl)
                    // The oldest conversations go first; TinyLFU's admission would instead
                    // refuse a new response while old, rarely read ones stay.
                    .eviction_policy(moka::policy::EvictionPolicy::lru())
                    .build(),
            ),
        };
        Self {
            backend,
            ttl: settings.responses_ttl,
            tidy_queued: Arc::default(),
        }
    }

    /// Applies the in-process store's pending writes, its evictions among them, in a task of
    /// its own that runs once the current one yields: the cap holds as soon as the answer that
    /// filled it is out, and the client does not wait for the store's bookkeeping (it reaches
    /// into the cache's cold lists and counters, several microseconds in a store grown large).
    /// One tidy-up queued at a time serves every write before it runs.
    fn tidy_soon(&self, cache: &moka::future::Cache<String, Arc<Entry>>) {
        if self.tidy_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.tidy_queued.store(false, Ordering::Release);
            return;
        };
        let (cache, queued) = (cache.clone(), self.tidy_queued.clone());
        handle.spawn(async move {
            queued.store(false, Ordering::Release);
            cache.run_pending_tasks().await;
        });
    }

    fn local_key(key: &str, kind: Kind, id: &str) -> String {
        // The key name's length first: no id a client sends can make one key's entry read as
        // another key's, whatever characters either holds.
        let mut length = itoa::Buffer::new();
        Self::joined(&[
            length.format(key.len()),
            ":",
            key,
            ":",
            kind.name(),
            ":",
            id,
        ])
    }

    /// The same layout as the limits' keys: the gateway key is the cluster hash tag.
    fn redis_key(key: &str, kind: Kind, id: &str) -> String {
        Self::joined(&["modelgate:{", key, "}:", kind.name(), ":", id])
    }

    /// `parts` end to end, allocated once (a stored answer makes a key for itself and for
    /// each of its items).
    fn joined(parts: &[&str]) -> String {
        let mut joined = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        parts.iter().for_each(|p| joined.push_str(p));
        joined
    }

    async fn get_raw(
        &self,
        key: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Option<Arc<Entry>>, StoreError> {
        if !storable(id) {
            return Ok(None);
        }
        match &self.backend {
            Backend::Local(c) => Ok(c.get(&Self::local_key(key, kind, id)).await),
            Backend::Redis(_) => Ok(self.get_raw_all(key, kind, &[id]).await?.pop().flatten()),
        }
    }

    /// The record of response `id` made by `key`, if it is still kept.
    pub async fn get(&self, key: &str, id: &str) -> Result<Option<Record>, StoreError> {
        match self.get_raw(key, Kind::Response, id).await? {
            None => Ok(None),
            Some(entry) => serde_json::from_str(&entry.text)
                .map(Some)
                .map_err(|e| StoreError(format!("a stored response did not parse: {e}"))),
        }
    }

    /// Keeps `record` as response `id` of `key`, and `items` as ids found in it.
    pub async fn put(
        &self,
        key: &str,
        id: &str,
        record: &Record,
        items: &[String],
    ) -> Result<(), StoreError> {
        let text = serde_json::to_string(record)
            .map_err(|e| StoreError(format!("a response could not be written: {e}")))?;
        self.put_text(key, id, text, items, None).await
    }

    /// [`Self::put`] for a record already written as text, with where its items lie when it
    /// is a translated one written here (the in-process store keeps that too).
    async fn put_text(
        &self,
        key: &str,
        id: &str,
        text: String,
        items: &[String],
        index: Option<RecordIndex>,
    ) -> Result<(), StoreError> {
        if !storable(id) {
            return Err(StoreError(format!(
                "a response id of {} bytes cannot be stored",
                id.len()
            )));
        }
        let items = items.iter().filter(|i| storable(i));
        match &self.backend {
            Backend::Local(c) => {
                let entry = Arc::new(Entry { text, index });
                c.insert(Self::local_key(key, Kind::Response, id), entry)
                    .await;
                let id = Entry::text(id.to_owned());
                for item in items {
                    c.insert(Self::local_key(key, Kind::Item, item), id.clone())
                        .await;
                }
                self.tidy_soon(c);
                Ok(())
            }
            Backend::Redis(r) => {
                let index =
                    index.map(|i| (Self::redis_key(key, Kind::Index, id), i.encoded(text.len())));
                let mut entries = vec![(Self::redis_key(key, Kind::Response, id), text)];
                entries.extend(index);
                entries.extend(
                    items.map(|item| (Self::redis_key(key, Kind::Item, item), id.to_owned())),
                );
                let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
                r.set_all(&entries, ttl_ms).await
            }
        }
    }

    /// Forgets response `id` of `key` (and its record's index); true when it was kept. Its item
    /// index entries expire on their own: they point at a record that is gone, which reads as
    /// unknown.
    pub async fn delete(&self, key: &str, id: &str) -> Result<bool, StoreError> {
        if !storable(id) {
            return Ok(false);
        }
        match &self.backend {
            Backend::Local(c) => Ok(c
                .remove(&Self::local_key(key, Kind::Response, id))
                .await
                .is_some()),
            Backend::Redis(r) => {
                r.delete(&[
                    Self::redis_key(key, Kind::Response, id),
                    Self::redis_key(key, Kind::Index, id),
                ])
                .await
            }
        }
    }

    /// The entries of several ids of one kind, in the order of `ids`, in one round trip to
    /// Redis: a turn of the AI SDK's sends a reference for every earlier item it got. A record
    /// from Redis is asked for with its index.
    async fn get_raw_all(
        &self,
        key: &str,
        kind: Kind,
        ids: &[&str],
    ) -> Result<Vec<Option<Arc<Entry>>>, StoreError> {
        match &self.backend {
            Backend::Local(c) => {
                let mut found = Vec::with_capacity(ids.len());
                for id in ids {
                    found.push(match storable(id) {
                        true => c.get(&Self::local_key(key, kind, id)).await,
                        false => None,
                    });
                }
                Ok(found)
            }
            Backend::Redis(r) => {
                let indexed = kind == Kind::Response;
                let mut asked = Vec::with_capacity(ids.len() * (1 + usize::from(indexed)));
                for id in ids.iter().filter(|id| storable(id)) {
                    asked.push(Self::redis_key(key, kind, id));
                    if indexed {
                        asked.push(Self::redis_key(key, Kind::Index, id));
                    }
                }
                let mut answers = r.get_all(&asked).await?.into_iter();
                let mut next = || {
                    let text = answers.next().flatten();
                    let index = if indexed {
                        answers.next().flatten()
                    } else {
                        None
                    };
                    let text = text?;
                    let index = index.and_then(|i| RecordIndex::decoded(&i, text.len()));
                    Some(Arc::new(Entry { text, index }))
                };
                Ok(ids
                    .iter()
                    .map(|id| if storable(id) { next() } else { None })
                    .collect())
            }
        }
    }
}

/// A responses request after its stored state was looked up.
pub struct Prepared {
    /// The body to plan with: the client's, or one with the conversation expanded in.
    pub body: Bytes,
    /// The client's `store` (default true).
    pub store: bool,
    /// The client's `previous_response_id`, echoed in the reply.
    pub previous: Option<String>,
    /// The upstream that holds the previous (passthrough) response: only it can continue it.
    pub pinned: Option<String>,
    /// Input items from this index on are the request's own (before: expanded history).
    own_from: usize,
    /// The expanded `input`, when there is one: `body` is then not the client's.
    expansion: Option<Arc<Expansion>>,
}

impl Prepared {
    /// True when `body` is not the client's.
    pub fn rewritten(&self) -> bool {
        self.expansion.is_some()
    }

    /// The client's body object as planned: when it is rewritten, without
    /// `previous_response_id` and with `input` expanded. Made from the client's object (each
    /// value checked there, the stored items checked when they were first sent or written by
    /// the gateway), so the rewritten body is not read again.
    pub fn object<'a>(&'a self, client: &RawObject<'a>) -> RawObject<'a> {
        let mut body = client.clone();
        if let Some(expansion) = &self.expansion {
            body.remove("previous_response_id");
            body.set_text("input", Cow::Borrowed(&expansion.text));
        }
        body
    }
}

fn store_failed(e: &StoreError) -> GatewayError {
    tracing::warn!(error = %e, "the response store failed");
    GatewayError::new(
        ErrorKind::StoreUnavailable,
        "the response store is unreachable; try again shortly",
    )
}

/// Reads `store` and `previous_response_id`, and when the request refers to stored state,
/// writes the stored items into its `input`: a translated previous response's input and output
/// before the request's own items, and each `item_reference` the key's store knows replaced by
/// its item. References it does not know are left for a responses upstream (which may hold
/// them) or refused by the translator with a 404.
pub async fn prepare(
    store: &ResponseStore,
    key: &str,
    bytes: &Bytes,
    obj: &RawObject<'_>,
) -> Result<Prepared, GatewayError> {
    let flag = match obj.get_present("store").map(|r| r.get()) {
        None | Some("null" | "true") => true,
        Some("false") => false,
        Some(_) => return Err(GatewayError::invalid("store", "`store` must be a boolean")),
    };
    let previous = match obj.get_present("previous_response_id") {
        None => None,
        Some(raw) if raw.get() == "null" => None,
        Some(raw) => match serde_json::from_str::<String>(raw.get()) {
            Ok(s) => Some(s),
            Err(_) => {
                return Err(GatewayError::invalid(
                    "previous_response_id",
                    "`previous_response_id` must be a string",
                ))
            }
        },
    };
    let mut prepared = Prepared {
        body: bytes.clone(),
        store: flag,
        previous: previous.clone(),
        pinned: None,
        own_from: 0,
        expansion: None,
    };
    let input_raw = obj.get_present("input").map(|r| r.get());
    let references =
        input_raw.is_some_and(|t| memchr::memmem::find(t.as_bytes(), b"item_reference").is_some());
    if previous.is_none() && !references {
        return Ok(prepared);
    }
    let previous_text = match &previous {
        None => None,
        Some(id) => {
            match (store.get_raw(key, Kind::Response, id).await).map_err(|e| store_failed(&e))? {
                Some(entry) => Some(entry),
                None => {
                    return Err(GatewayError::new(
                        ErrorKind::PreviousResponseNotFound,
                        format!("Previous response with id '{}' not found.", printable(id)),
                    )
                    .with_param("previous_response_id"))
                }
            }
        }
    };
    let previous_record = (previous_text.as_deref().map(StoredRecord::of))
        .transpose()
        .map_err(|e| store_failed(&e))?;
    // A passthrough conversation lives upstream: its references are the upstream's too.
    if let Some(StoredRecord::Passthrough(upstream)) = previous_record {
        prepared.pinned = Some(upstream);
        return Ok(prepared);
    }
    let history: Vec<&ItemSpan<'_>> = previous_record
        .iter()
        .flat_map(StoredRecord::items)
        .collect();
    let own = match input_raw {
        None => Loose::Absent,
        Some(text) => (hand::value(text))
            .or_else(|| serde_json::from_str(text).ok())
            .unwrap_or_default(),
    };
    let own_items = match &own {
        Loose::Absent | Loose::Null | Loose::Str(_) => &[][..],
        Loose::Arr(items) => items.as_slice(),
        // Anything else is the translator's to refuse, with its own message.
        _ if previous.is_none() => return Ok(prepared),
        _ => {
            return Err(GatewayError::invalid(
                "input",
                "`input` must be a string or an array of items",
            ))
        }
    };
    // References to items neither the history nor an item before them holds are looked up in
    // the key's item index, all at once, and each record holding one is read once.
    // Sized for every item at once: grown step by step, a long history is hashed again at each.
    let mut seen: HashSet<&str> = HashSet::with_capacity(history.len() + own_items.len());
    seen.extend(history.iter().filter_map(|i| i.typed.id.as_str()));
    let mut wanted = Vec::new();
    for item in own_items {
        match (reference(item), item.typed.id.as_str()) {
            (Some(id), _) => {
                if seen.insert(id) {
                    wanted.push(id);
                }
            }
            (None, Some(id)) => {
                seen.insert(id);
            }
            (None, None) => {}
        }
    }
    // An id of the form the gateway gives the items of the answers it keeps names the answer
    // that holds it; only others are asked of the index (one round trip to Redis for all).
    let named: Vec<Option<Arc<str>>> = (wanted.iter())
        .map(|id| ir::answer_named_by(id).map(Arc::from))
        .collect();
    let unnamed: Vec<&str> = (wanted.iter().zip(&named))
        .filter_map(|(id, answer)| answer.is_none().then_some(*id))
        .collect();
    let mut indexed = match unnamed.is_empty() {
        true => Vec::new(),
        false => {
            (store.get_raw_all(key, Kind::Item, &unnamed).await).map_err(|e| store_failed(&e))?
        }
    }
    .into_iter();
    let holders: Vec<Option<Arc<str>>> = (named.into_iter())
        .map(|answer| {
            answer.or_else(|| (indexed.next().flatten()).map(|e| Arc::from(e.text.as_str())))
        })
        .collect();
    // The latest answer a request refers to is read first: it holds, copied into its input,
    // whatever the turns before it referred to. An AI SDK turn refers to every earlier answer,
    // the last one after all the others, so this one read resolves it, however long the
    // conversation; the records of references it does not hold are then read together.
    let latest = holders.iter().rev().flatten().next().cloned();
    let latest_text = match &latest {
        Some(id) => (store.get_raw_all(key, Kind::Response, &[id]).await)
            .map_err(|e| store_failed(&e))?
            .pop()
            .flatten(),
        None => None,
    };
    let latest_record = (latest_text.as_deref().map(StoredRecord::of))
        .transpose()
        .map_err(|e| store_failed(&e))?;
    let latest_items = (latest_record.as_ref())
        .map(|r| first_by_id(r.items(), 0))
        .unwrap_or_default();
    // The records of the references the latest does not hold, each once.
    let mut others: Vec<&str> = Vec::new();
    for (id, holder) in wanted.iter().zip(&holders) {
        let Some(holder) = holder.as_deref() else {
            continue;
        };
        if !latest_items.contains_key(id)
            && latest.as_deref() != Some(holder)
            && !others.contains(&holder)
        {
            others.push(holder);
        }
    }
    let texts =
        (store.get_raw_all(key, Kind::Response, &others).await).map_err(|e| store_failed(&e))?;
    let records = (texts.iter())
        .map(|entry| entry.as_deref().map(StoredRecord::of).transpose())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| store_failed(&e))?;
    // A record no longer kept (or a passthrough one) holds no item the gateway knows.
    let found: Vec<HashMap<&str, &ItemSpan<'_>>> = (records.iter())
        .map(|r| {
            r.as_ref()
                .map(|r| first_by_id(r.items(), 0))
                .unwrap_or_default()
        })
        .collect();
    let mut resolved: HashMap<&str, &ItemSpan<'_>> = HashMap::with_capacity(wanted.len());
    for (id, holder) in wanted.iter().zip(&holders) {
        let item = latest_items.get(id).or_else(|| {
            let at = others.iter().position(|r| Some(*r) == holder.as_deref())?;
            found.get(at)?.get(id)
        });
        if let Some(item) = item {
            resolved.insert(id, item);
        }
    }
    prepared.own_from = history.len();
    prepared.expansion = Some(Arc::new(expanded(
        &history,
        &own,
        own_items,
        &resolved,
        prepared.store,
    )));
    prepared.body = Bytes::from(prepared.object(obj).to_vec());
    Ok(prepared)
}

/// An item as read for continuing a conversation: its text, its id and type.
type ItemSpan<'a> = Spanned<'a, ItemHead<'a>>;

/// The id an `item_reference` item refers to.
fn reference<'i>(item: &'i ItemSpan<'_>) -> Option<&'i str> {
    match item.typed.kind.as_str() {
        Some("item_reference") => item.typed.id.as_str(),
        _ => None,
    }
}

/// Each id's first item (one with text), as a search from the front finds it; with room for
/// `more`.
fn first_by_id<'i, 'a: 'i>(
    items: impl Iterator<Item = &'i ItemSpan<'a>>,
    more: usize,
) -> HashMap<&'i str, &'i ItemSpan<'a>> {
    // Sized once: the items are slices', whose count the hint gives exactly.
    let mut by_id = HashMap::with_capacity(items.size_hint().0 + more);
    for item in items {
        if let (Some(id), Some(_)) = (item.typed.id.as_str(), item.text) {
            by_id.entry(id).or_insert(item);
        }
    }
    by_id
}

/// A continued request's `input` as planned: its text, and when its answer is to be kept,
/// where each item lies in it with what keeping it reads of the item, so the record is made
/// without reading the input again.
#[derive(Debug)]
struct Expansion {
    text: String,
    items: Vec<(Range<usize>, Head)>,
}

impl Expansion {
    /// [`input_items`] of a body whose `input` is this expansion.
    fn stored(&self, own_from: usize, minted: &InputIds) -> KeptInput {
        let items =
            (self.items.iter()).map(|(at, head)| (self.text.get(at.clone()), &head.id, &head.kind));
        stored_input(items, self.text.len(), own_from, minted)
    }
}

/// An item's id and type as keeping it reads them ([`ItemHead`]), owned: only whether each is
/// absent, a string or anything else counts, so anything else is kept as `null`.
#[derive(Debug)]
struct Head {
    id: Loose<'static>,
    kind: Loose<'static>,
}

impl Head {
    fn of(head: &ItemHead<'_>) -> Self {
        Self {
            id: owned(&head.id),
            kind: owned(&head.kind),
        }
    }

    /// The head reading the item gives, borrowed from this one.
    fn read(&self) -> ItemHead<'_> {
        fn borrowed<'h>(l: &'h Loose<'static>) -> Loose<'h> {
            match l {
                Loose::Absent => Loose::Absent,
                Loose::Str(s) => Loose::Str(Cow::Borrowed(s.as_ref())),
                _ => Loose::Null,
            }
        }
        ItemHead {
            id: borrowed(&self.id),
            kind: borrowed(&self.kind),
            ..ItemHead::default()
        }
    }

    /// The bytes its strings hold beside it.
    fn heap_len(&self) -> usize {
        let len = |l: &Loose<'static>| match l {
            Loose::Str(Cow::Owned(s)) => s.len(),
            _ => 0,
        };
        len(&self.id) + len(&self.kind)
    }
}

/// A head member as [`Head`] keeps it: absent, a string, or anything else as `null`.
fn owned(l: &Loose<'_>) -> Loose<'static> {
    match l {
        Loose::Absent => Loose::Absent,
        // The type an easy-form message is given: kept without an allocation.
        Loose::Str(s) if s == "message" => Loose::Str(Cow::Borrowed("message")),
        Loose::Str(s) => Loose::Str(Cow::Owned(s.to_string())),
        _ => Loose::Null,
    }
}

/// The `input` a continued request is planned with (its text; with `kept`, also its items'
/// places and heads for storing the answer): the history's items, then the request's own
/// (`own` is its `input`; `own_items` the items of an array), each reference replaced by the
/// first earlier item with its id, else by the item the index `resolved` it to, else kept for
/// the upstream or the translator. Every item is copied as its text.
fn expanded(
    history: &[&ItemSpan<'_>],
    own: &Loose<'_, ItemSpan<'_>>,
    own_items: &[ItemSpan<'_>],
    resolved: &HashMap<&str, &ItemSpan<'_>>,
    kept: bool,
) -> Expansion {
    let message = match own {
        Loose::Str(text) => Some(user_message(text, None)),
        _ => None,
    };
    // The head reading the message would give: it has a type and no id.
    let message_head = ItemHead {
        kind: Loose::Str(Cow::Borrowed("message")),
        ..ItemHead::default()
    };
    let mut parts: Vec<(&str, &ItemHead<'_>)> =
        Vec::with_capacity(history.len() + own_items.len() + 1);
    parts.extend(history.iter().filter_map(|i| Some((i.text?, &i.typed))));
    parts.extend(message.as_deref().map(|m| (m, &message_head)));
    let mut earlier = first_by_id(history.iter().copied(), own_items.len());
    for item in own_items {
        let Some(text) = item.text else { continue };
        let chosen = match reference(item) {
            Some(id) => (earlier.get(id).or_else(|| resolved.get(id)).copied()).unwrap_or(item),
            None => item,
        };
        // The maps hold items with text only.
        parts.push((chosen.text.unwrap_or(text), &chosen.typed));
        if let Some(id) = item.typed.id.as_str() {
            earlier.entry(id).or_insert(chosen);
        }
    }
    // Sized once the references' items are known: each is longer than its reference.
    let mut out = Expansion {
        text: String::with_capacity(parts.iter().map(|(t, _)| t.len() + 1).sum::<usize>() + 1),
        items: Vec::with_capacity(if kept { parts.len() } else { 0 }),
    };
    out.text.push('[');
    for (i, (text, head)) in parts.iter().enumerate() {
        if i > 0 {
            out.text.push(',');
        }
        let start = out.text.len();
        out.text.push_str(text);
        if kept {
            out.items.push((start..out.text.len(), Head::of(head)));
        }
    }
    out.text.push(']');
    out
}

/// An id as it may appear in a message: printable and bounded, whatever the client sent.
fn printable(id: &str) -> String {
    id.chars()
        .filter(|c| !c.is_control())
        .take(MAX_ID_LEN)
        .collect()
}

/// Gives an input item (at `place` in its answer's input) an id when it has none, so
/// `input_items` can page through it, and an easy-form message its type, so it reads back in
/// the full form OpenAI lists. True when the id is one `ids` made.
fn complete_item(item: &mut Value, ids: &InputIds, place: usize) -> bool {
    let Some(obj) = item.as_object_mut() else {
        return false;
    };
    let minted = !obj.get("id").is_some_and(Value::is_string);
    if minted {
        let id = ids.mint(obj.get("type").and_then(Value::as_str), place);
        obj.insert("id".to_owned(), Value::String(id));
    }
    obj.entry("type").or_insert_with(|| Value::from("message"));
    minted
}

/// The user message a string `input` stands for, with `id` when it has one, written as serde
/// writes its tree (members in alphabetical order).
fn user_message(text: &str, id: Option<&str>) -> String {
    let mut item = Vec::with_capacity(text.len() + 112);
    item.extend_from_slice(br#"{"content":[{"text":"#);
    crate::json::write_json_str(&mut item, text);
    item.extend_from_slice(br#","type":"input_text"}],"#);
    if let Some(id) = id {
        // A minted id is letters, digits and `_`: nothing to escape.
        item.extend_from_slice(br#""id":""#);
        item.extend_from_slice(id.as_bytes());
        item.extend_from_slice(br#"","#);
    }
    item.extend_from_slice(br#""role":"user","type":"message"}"#);
    String::from_utf8(item).unwrap_or_default()
}

/// Ids for the input items of one stored answer that came without one ([`ir::ItemIds`]): when
/// the answer's id is one the gateway minted, each names it and the item's place, as the
/// translator's ids for its output items do, so a reference to it finds its record without an
/// entry in the item index (a client that sends its whole history in easy form on every turn
/// has each of its items given a new id every turn). Any other answer id: random ids, indexed.
struct InputIds(ir::ItemIds);

impl InputIds {
    fn new(answer_id: &str) -> Self {
        Self(ir::ItemIds::of(answer_id))
    }

    /// A new id for an item of type `kind` at `place` in the answer's input.
    fn mint(&self, kind: Option<&str>, place: usize) -> String {
        let prefix = match kind {
            None | Some("message") => "msg_",
            Some(_) => "item_",
        };
        self.0.input(prefix, place)
    }

    /// True when the ids it makes name their answer, so they need no index entry.
    fn names_answer(&self) -> bool {
        self.0.names_answer()
    }
}

lax_struct! {
    /// What keeping a translated answer reads of its request: its input items, each as its
    /// text and the two members completing it may add.
    struct StoredInput<'a> {
        input: Loose<'a, Spanned<'a, ItemHead<'a>>>,
    }
}

lax_struct! {
    struct ItemHead<'a> {
        id: Loose<'a>,
        kind = "type": Loose<'a>,
    }
}

lax_struct! {
    /// What continuing a conversation reads of a stored record (a [`Record`]'s text): its
    /// kind, a passthrough one's upstream, a translated one's items.
    struct RecordFields<'a> {
        kind: Loose<'a>,
        upstream: Loose<'a>,
        response: Loose<'a, IgnoredAny, ResponseOutput<'a>>,
        input: Loose<'a, ItemSpan<'a>>,
    }
}

lax_struct! {
    struct ResponseOutput<'a> {
        output: Loose<'a, ItemSpan<'a>>,
    }
}

/// A stored record read for continuing from it, without a tree of its items: an agent's whole
/// history is in each.
enum StoredRecord<'a> {
    Translated(RecordFields<'a>),
    Passthrough(String),
}

/// Where a translated record written by this process lies in its text: its response object,
/// and each input item with the head reading it gives. An AI SDK turn reads the latest record,
/// which holds the whole conversation: from the index only the answer's own output is read.
#[derive(Debug)]
struct RecordIndex {
    response: Range<usize>,
    input: Vec<(Range<usize>, Head)>,
}

/// What [`RecordIndex::encoded`] starts with: a later form gets another tag, which this version
/// does not decode (and reads the record whole).
const INDEX_FORM: &str = "i1";

impl RecordIndex {
    /// The index as Redis keeps it beside its record of `text_len` bytes: the form's tag, that
    /// length, the response's place, then each item's place and head, all separated by spaces;
    /// a head member is `a` (absent), `n` (anything but a string) or a string's length, `:` and
    /// the string.
    fn encoded(&self, text_len: usize) -> String {
        let heads: usize = (self.input.iter()).map(|(_, h)| h.heap_len()).sum();
        let mut out = String::with_capacity(32 + self.input.len() * 40 + heads);
        let mut n = itoa::Buffer::new();
        let mut number = |out: &mut String, v: usize| {
            out.push(' ');
            out.push_str(n.format(v));
        };
        out.push_str(INDEX_FORM);
        number(&mut out, text_len);
        number(&mut out, self.response.start);
        number(&mut out, self.response.end);
        for (at, head) in &self.input {
            number(&mut out, at.start);
            number(&mut out, at.end);
            for member in [&head.id, &head.kind] {
                match member {
                    Loose::Absent => out.push_str(" a"),
                    Loose::Str(s) => {
                        number(&mut out, s.len());
                        out.push(':');
                        out.push_str(s);
                    }
                    _ => out.push_str(" n"),
                }
            }
        }
        out
    }

    /// The index [`Self::encoded`] wrote for a record of `text_len` bytes; `None` for anything
    /// else (another form, another record's length, places outside the record), and the record
    /// is then read whole. Within that, the index is trusted as the record is: both are the
    /// gateway's, written in one transaction; a place is checked only to lie within the record
    /// and ([`StoredRecord::indexed`]) between its characters.
    fn decoded(encoded: &str, text_len: usize) -> Option<Self> {
        if !encoded.starts_with(INDEX_FORM) {
            return None;
        }
        let mut read = IndexReader {
            text: encoded,
            at: INDEX_FORM.len(),
        };
        if read.number()? != text_len {
            return None;
        }
        let response = read.place(text_len)?;
        let mut input = Vec::new();
        while read.at < encoded.len() {
            let at = read.place(text_len)?;
            let (id, kind) = (read.member()?, read.member()?);
            input.push((at, Head { id, kind }));
        }
        Some(Self { response, input })
    }
}

/// Reads an encoded [`RecordIndex`] forward, by hand over its bytes: `str::parse` and slicing
/// at each step cost several times as much, and a turn decodes four numbers an item.
struct IndexReader<'e> {
    text: &'e str,
    at: usize,
}

impl IndexReader<'_> {
    /// The number after the next space.
    fn number(&mut self) -> Option<usize> {
        let bytes = self.text.as_bytes();
        if bytes.get(self.at) != Some(&b' ') {
            return None;
        }
        let start = self.at + 1;
        let mut v: usize = 0;
        let mut i = start;
        while let Some(&digit) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
            v = v.checked_mul(10)?.checked_add(usize::from(digit - b'0'))?;
            i += 1;
        }
        self.at = i;
        (i > start).then_some(v)
    }

    /// A place: two numbers, in order, within the record's `text_len` bytes.
    fn place(&mut self, text_len: usize) -> Option<Range<usize>> {
        let (start, end) = (self.number()?, self.number()?);
        (start <= end && end <= text_len).then_some(start..end)
    }

    /// A head member: absent, not a string, or a string its length says the end of (which
    /// must fall between characters).
    fn member(&mut self) -> Option<Loose<'static>> {
        let tagged = match self.text.as_bytes().get(self.at..self.at + 2) {
            Some(b" a") => Loose::Absent,
            Some(b" n") => Loose::Null,
            _ => {
                let len = self.number()?;
                if self.text.as_bytes().get(self.at) != Some(&b':') {
                    return None;
                }
                let start = self.at + 1;
                let end = start.checked_add(len)?;
                let string = self.text.get(start..end)?;
                self.at = end;
                return Some(owned(&Loose::Str(Cow::Borrowed(string))));
            }
        };
        self.at += 2;
        Some(tagged)
    }
}

impl<'a> StoredRecord<'a> {
    /// [`Self::read`] of an entry's text, from its index when it has one.
    fn of(entry: &'a Entry) -> Result<Self, StoreError> {
        match (entry.index.as_ref()).and_then(|index| Self::indexed(&entry.text, index)) {
            Some(record) => Ok(record),
            None => Self::read(&entry.text),
        }
    }

    /// The record [`Self::read`] gives of `text`, which `index` was made with; `None` where the
    /// response does not read as the whole record's read would (then the record is read).
    fn indexed(text: &'a str, index: &'a RecordIndex) -> Option<Self> {
        let response = lax::parse::<Loose<'a, IgnoredAny, ResponseOutput<'a>>>(
            text.get(index.response.clone())?.as_bytes(),
        )
        .ok()?;
        let input = (index.input.iter())
            .map(|(at, head)| {
                Some(Spanned {
                    text: Some(text.get(at.clone())?),
                    typed: head.read(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self::Translated(RecordFields {
            kind: Loose::Str(Cow::Borrowed("translated")),
            response,
            input: Loose::Arr(input),
            ..RecordFields::default()
        }))
    }

    /// Reads what [`ResponseStore::get`] would, failing where it fails.
    fn read(text: &'a str) -> Result<Self, StoreError> {
        let unread = || StoreError("a stored response did not parse".to_owned());
        let fields = lax::parse::<RecordFields<'a>>(text.as_bytes()).map_err(|_| unread())?;
        match (fields.kind.as_str(), &fields.upstream, &fields.input) {
            (Some("passthrough"), Loose::Str(upstream), _) => {
                Ok(Self::Passthrough(upstream.to_string()))
            }
            (Some("translated"), _, Loose::Arr(_)) if !matches!(fields.response, Loose::Absent) => {
                Ok(Self::Translated(fields))
            }
            _ => Err(unread()),
        }
    }

    /// A translated record's items as a continuation sees them: its input, then its output.
    fn items(&self) -> impl Iterator<Item = &ItemSpan<'a>> {
        let (input, output) = match self {
            Self::Translated(f) => (
                f.input.as_array().unwrap_or_default(),
                (f.response.as_object())
                    .and_then(|r| r.output.as_array())
                    .unwrap_or_default(),
            ),
            Self::Passthrough(_) => (&[][..], &[][..]),
        };
        input.iter().chain(output)
    }
}

/// The input items to keep for a translated response, as the text of a JSON array: the
/// (expanded) request's `input`, each item completed ([`complete_item`]), with where each lies
/// and its head; and the ids of the items from `own_from` on to index, but for those `minted`
/// made to name the answer. An item is kept as the client wrote it, a missing id or type
/// written in front of its members: an agent sends its whole history on every turn, which
/// would otherwise be made a tree and written out again each time. Only an item whose `id` is
/// there but not a string (which completing replaces) goes through a tree.
fn input_items(body: &[u8], own_from: usize, minted: &InputIds) -> KeptInput {
    let input = lax::parse::<StoredInput<'_>>(body).map(|b| b.input);
    let items = match input {
        Ok(Loose::Arr(items)) => items,
        Ok(Loose::Str(text)) => {
            let id = minted.mint(None, 0);
            let text = ["[", &user_message(&text, Some(&id)), "]"].concat();
            let indexed = own_from == 0 && !minted.names_answer();
            let head = Head {
                id: Loose::Str(Cow::Owned(id.clone())),
                kind: Loose::Str(Cow::Borrowed("message")),
            };
            return KeptInput {
                items: vec![(1..text.len() - 1, head)],
                text,
                ids: if indexed { vec![id] } else { Vec::new() },
            };
        }
        _ => {
            return KeptInput {
                text: "[]".to_owned(),
                items: Vec::new(),
                ids: Vec::new(),
            }
        }
    };
    let items = (items.iter()).map(|item| (item.text, &item.typed.id, &item.typed.kind));
    stored_input(items, body.len(), own_from, minted)
}

/// A translated record's input items as kept: the text of their array, where each item lies
/// in it with the head reading it gives, and the ids to index.
#[derive(Debug)]
struct KeptInput {
    text: String,
    items: Vec<(Range<usize>, Head)>,
    ids: Vec<String>,
}

/// The part of [`input_items`] after reading the items: each item's text, id and type, in
/// order; `len` the length of the text they are read from.
fn stored_input<'t, 'a: 't>(
    items: impl ExactSizeIterator<Item = (Option<&'t str>, &'t Loose<'a>, &'t Loose<'a>)>,
    len: usize,
    own_from: usize,
    minted: &InputIds,
) -> KeptInput {
    // Room for an id and a type written into each item.
    let mut text = String::with_capacity(len + 64 * items.len());
    let mut heads = Vec::with_capacity(items.len());
    let mut ids = Vec::new();
    text.push('[');
    for (i, (raw, head_id, head_kind)) in items.enumerate() {
        let Some(raw) = raw else { continue };
        if text.len() > 1 {
            text.push(',');
        }
        let start = text.len();
        // The item's id, whether it was minted here, and its type as reading it back gives.
        let (id, made, kind) = match (head_id, raw.strip_prefix('{')) {
            // Not an object: kept as it is, with no id.
            (_, None) => {
                text.push_str(raw);
                (None, false, owned(head_kind))
            }
            (Loose::Str(id), Some(_)) if !matches!(head_kind, Loose::Absent) => {
                text.push_str(raw);
                (Some(id.to_string()), false, owned(head_kind))
            }
            (Loose::Str(_) | Loose::Absent, Some(members)) => {
                text.push('{');
                let (id, made) = match head_id {
                    Loose::Str(id) => (id.to_string(), false),
                    _ => {
                        // A minted id is letters, digits and `_`: nothing to escape.
                        let id = minted.mint(head_kind.as_str(), i);
                        text.push_str("\"id\":\"");
                        text.push_str(&id);
                        text.push_str("\",");
                        (id, true)
                    }
                };
                let kind = match head_kind {
                    Loose::Absent => {
                        text.push_str("\"type\":\"message\",");
                        Loose::Str(Cow::Borrowed("message"))
                    }
                    kind => owned(kind),
                };
                if members.trim_start().starts_with('}') {
                    text.pop();
                }
                text.push_str(members);
                (Some(id), made, kind)
            }
            (_, Some(_)) => {
                let mut tree = serde_json::from_str::<Value>(raw).unwrap_or(Value::Null);
                let made = complete_item(&mut tree, minted, i);
                let written = serde_json::to_string(&tree).unwrap_or_else(|_| "null".to_owned());
                text.push_str(&written);
                let kind = match tree.get("type") {
                    None => Loose::Absent,
                    Some(Value::String(kind)) => owned(&Loose::Str(Cow::Borrowed(kind))),
                    Some(_) => Loose::Null,
                };
                (
                    tree.get("id").and_then(Value::as_str).map(str::to_owned),
                    made,
                    kind,
                )
            }
        };
        // An id that names its answer (this one's, minted here, or an earlier one's, copied
        // from its record) is found from itself: it needs no index entry.
        let named = match made {
            true => minted.names_answer(),
            false => id.as_deref().is_some_and(ir::names_an_answer),
        };
        if i >= own_from && !named {
            ids.extend(id.clone());
        }
        let id = id.map_or(Loose::Absent, |id| Loose::Str(Cow::Owned(id)));
        heads.push((start..text.len(), Head { id, kind }));
    }
    text.push(']');
    KeptInput {
        text,
        items: heads,
        ids,
    }
}

/// How the answer to a responses request was produced.
pub enum Served {
    /// Translated here (or by the mock): the gateway keeps it.
    Kept,
    /// Passed through to this responses upstream, which keeps it.
    Upstream(String),
}

/// What storing one answer needs once its final response object is known.
struct Job {
    store: Arc<ResponseStore>,
    key: String,
    served: Served,
    body: Bytes,
    /// The request's `input` as expanded, when it was: its items need not be read again.
    expansion: Option<Arc<Expansion>>,
    own_from: usize,
}

/// What keeping a response object needs of its text, read without a tree: its id and its
/// output items' ids (`None`, with a warning, when it has no id: nothing to keep it under).
fn final_of(text: &str, ids: &StoredIds<'_>) -> Option<Final> {
    let Some(id) = ids.id.as_str() else {
        tracing::warn!("a responses answer had no id; not stored");
        return None;
    };
    Some(Final {
        text: text.into(),
        id: id.to_owned(),
        output: (ids.output.as_array().unwrap_or_default().iter())
            .filter_map(|i| i.id.as_str().map(str::to_owned))
            .collect(),
    })
}

/// [`final_of`] a response object's text, when it is JSON.
fn read_final(text: &str) -> Option<Final> {
    let ids = lax::parse::<StoredIds<'_>>(text.as_bytes()).ok()?;
    final_of(text, &ids)
}

impl Job {
    async fn record(self, answer: &Final) {
        let id = &answer.id;
        let stored = match self.served {
            Served::Upstream(upstream) => {
                self.store
                    .put(&self.key, id, &Record::Passthrough { upstream }, &[])
                    .await
            }
            Served::Kept => {
                let ids = InputIds::new(id);
                let mut input = match &self.expansion {
                    Some(expansion) => expansion.stored(self.own_from, &ids),
                    None => input_items(&self.body, self.own_from, &ids),
                };
                // The translator's ids for the output name this answer: none is indexed then.
                input.ids.extend(
                    (answer.output.iter())
                        .filter(|id| !ir::names_an_answer(id))
                        .cloned(),
                );
                input.ids.dedup();
                let text = translated_text(&answer.text, &input.text);
                let index = record_index(&answer.text, input.items);
                (self.store)
                    .put_text(&self.key, id, text, &input.ids, Some(index))
                    .await
            }
        };
        if let Err(e) = stored {
            tracing::warn!(key = %self.key, error = %e, "a response was not stored");
        }
    }

    /// Stores `answer` at once when the store does not make it wait (the in-process one
    /// seldom does), else in a task of its own, which finishes even if the client leaves; the
    /// receiver then says when it is done. A task for every stream would cost its spawn and a
    /// second turn of the connection's task before the terminal frame goes out.
    fn start(self, answer: Final, cx: &mut Context<'_>) -> Option<oneshot::Receiver<()>> {
        let mut work = Box::pin(async move { self.record(&answer).await });
        if work.as_mut().poll(cx).is_ready() {
            return None;
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = oneshot::channel();
        // Detached on purpose: the store write is bounded by the store's own timeout, and a
        // client that hung up after `response.completed` should still find its response. The
        // waker the first poll left is this connection's: a stray wake-up at most.
        handle.spawn(async move {
            work.await;
            let _ = tx.send(());
        });
        Some(rx)
    }
}

/// Keeps what a successful `/v1/responses` answer served, unless the client said `store: false`.
/// A JSON answer is read whole and stored before it is sent; a stream is stored at its
/// terminal event, which reaches the client only once the store has it, so a next turn sent
/// on `response.completed` finds it.
pub async fn finish(
    store: Arc<ResponseStore>,
    key: &str,
    prepared: &Prepared,
    served: Served,
    mut resp: Response<Body>,
    max_event_bytes: usize,
) -> Result<Response<Body>, GatewayError> {
    if !prepared.store || !resp.status().is_success() {
        return Ok(resp);
    }
    let job = Job {
        store,
        key: key.to_owned(),
        served,
        body: prepared.body.clone(),
        expansion: prepared.expansion.clone(),
        own_from: prepared.own_from,
    };
    if body::is_event_stream(resp.headers()) {
        let watch = match resp.extensions_mut().remove::<FinalSlot>() {
            Some(slot) => TerminalWatch::Told(slot),
            None => TerminalWatch::Read(SseDecoder::with_limit(max_event_bytes)),
        };
        return Ok(resp.map(|b| BodyExt::boxed(Tap::new(b, job, watch))));
    }
    let told = resp.extensions_mut().remove::<FinalSlot>();
    let (mut parts, inner) = resp.into_parts();
    let bytes = body::collect_reply(inner).await?;
    // Kept as the text it is: what storing needs of it (its ids) is what the translator that
    // wrote it says, or read without a tree.
    let answer = (told.and_then(|slot| slot.take()))
        .or_else(|| std::str::from_utf8(&bytes).ok().and_then(read_final));
    if let Some(answer) = answer {
        job.record(&answer).await;
    }
    parts.headers.remove(http::header::CONTENT_LENGTH);
    Ok(Response::from_parts(parts, body::full(bytes)))
}

/// A responses event stream passed on frame by frame; its terminal event's response is stored
/// before the frame that carries it goes out.
struct Tap {
    inner: Body,
    watch: TerminalWatch,
    job: Option<Job>,
    waiting: Option<(oneshot::Receiver<()>, Frame<Bytes>)>,
}

impl Tap {
    fn new(inner: Body, job: Job, watch: TerminalWatch) -> Self {
        Self {
            inner,
            watch,
            job: Some(job),
            waiting: None,
        }
    }
}

/// Finds a responses stream's terminal event in its frames as they pass.
enum TerminalWatch {
    /// A stream this gateway translated: its encoder leaves the final response here when it
    /// writes the terminal event, in the frame that carries it.
    Told(FinalSlot),
    /// Any other (a responses upstream's, the mock's): its events are read.
    Read(SseDecoder),
}

impl TerminalWatch {
    /// The response object of the terminal event `data` completes, if it completes one;
    /// `Err` once an event is too large to read.
    fn frame(&mut self, data: &[u8]) -> Result<Option<Final>, EventTooLarge> {
        let decoder = match self {
            Self::Told(slot) => return Ok(slot.take()),
            Self::Read(decoder) => decoder,
        };
        // Every frame passes here, deltas by the hundred. Whole events that name no terminal
        // event, fed from between events, give nothing and leave the decoder between events:
        // they need not be decoded. A translated stream's frames always hold whole events, and
        // a burst's last frame holds its terminal event after all the others.
        let mut from = 0;
        if decoder.is_idle() {
            match first_terminal_name(data) {
                None if data.ends_with(b"\n\n") => return Ok(None),
                None => {}
                Some(at) => {
                    if let Some(end) = memchr::memmem::rfind(&data[..at], b"\n\n") {
                        from = end + 2;
                    }
                }
            }
        }
        let mut response = None;
        decoder.feed_with(&data[from..], |ev| {
            if response.is_none() {
                response = terminal(ev);
            }
        })?;
        Ok(response)
    }
}

/// Where `bytes` first name a terminal event: [`terminal`] finds one only where its name is
/// the event's, or is in its data.
fn first_terminal_name(bytes: &[u8]) -> Option<usize> {
    static NAMES: LazyLock<[memchr::memmem::Finder<'static>; 3]> =
        LazyLock::new(|| TERMINAL.map(memchr::memmem::Finder::new));
    NAMES.iter().filter_map(|name| name.find(bytes)).min()
}

const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// The response object of a terminal event, if `ev` is one.
fn terminal(ev: EventRef<'_>) -> Option<Final> {
    // Every event of a frame that is decoded passes here: one search rules out all that carry
    // no response object, before the names are looked for.
    static RESPONSE_KEY: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"\"response\""));
    let named = ev.event.is_some_and(|e| TERMINAL.contains(&e));
    if !named
        && (RESPONSE_KEY.find(ev.data.as_bytes()).is_none()
            || !TERMINAL.iter().any(|t| ev.data.contains(t)))
    {
        return None;
    }
    let event = lax::parse::<TerminalEvent<'_>>(ev.data.as_bytes()).ok()?;
    if !TERMINAL.contains(&event.kind.as_str()?) {
        return None;
    }
    let response = event.response;
    final_of(response.text?, &response.typed)
}

lax_struct! {
    /// What a terminal event is read for: its type, and its response object as text and for
    /// the ids storing it needs, in one read.
    struct TerminalEvent<'a> {
        kind = "type": Loose<'a>,
        response: Spanned<'a, StoredIds<'a>>,
    }
}

lax_struct! {
    /// What storing a response reads of it: its id and its output items' ids.
    struct StoredIds<'a> {
        id: Loose<'a>,
        output: Loose<'a, ItemId<'a>>,
    }
}

lax_struct! {
    struct ItemId<'a> {
        id: Loose<'a>,
    }
}

/// The stored text of a translated response: the text `Record::Translated` serialises to,
/// written around the response's and its input's own text rather than trees of them; read back
/// as any record.
fn translated_text(response: &str, input: &str) -> String {
    let mut text = String::with_capacity(response.len() + input.len() + 48);
    text.push_str(RECORD_HEAD);
    text.push_str(response);
    text.push_str(RECORD_INPUT);
    text.push_str(input);
    text.push('}');
    text
}

/// What a translated record's text holds before its response object, and between it and its
/// input items.
const RECORD_HEAD: &str = r#"{"kind":"translated","response":"#;
const RECORD_INPUT: &str = r#","input":"#;

/// Where [`translated_text`] puts `response` and the input `items` (placed in the input's text).
fn record_index(response: &str, mut items: Vec<(Range<usize>, Head)>) -> RecordIndex {
    let input_at = RECORD_HEAD.len() + response.len() + RECORD_INPUT.len();
    for (at, _) in &mut items {
        *at = at.start + input_at..at.end + input_at;
    }
    RecordIndex {
        response: RECORD_HEAD.len()..RECORD_HEAD.len() + response.len(),
        input: items,
    }
}

impl HttpBody for Tap {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some((rx, _)) = &mut this.waiting {
            // Done or dropped alike: the frame goes out either way.
            let _ = std::task::ready!(std::pin::Pin::new(rx).poll(cx));
            if let Some((_, frame)) = this.waiting.take() {
                return Poll::Ready(Some(Ok(frame)));
            }
        }
        let frame = match std::task::ready!(std::pin::Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        if let (Some(data), true) = (frame.data_ref(), this.job.is_some()) {
            match this.watch.frame(data) {
                Ok(None) => {}
                Ok(Some(response)) => {
                    if let Some(rx) = this.job.take().and_then(|job| job.start(response, cx)) {
                        this.waiting = Some((rx, frame));
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
                // Too large to read: the stream still flows, unstored.
                Err(EventTooLarge(_)) => this.job = None,
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.waiting.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// `GET /v1/responses/{id}/input_items` over a translated response's stored input, in
/// OpenAI's list shape: newest first unless `order=asc`, `limit` 1–100 (20), after `after`.
pub fn input_items_page(input: &[Value], query: Option<&str>) -> Result<Value, GatewayError> {
    let mut limit = 20usize;
    let mut asc = false;
    let mut after: Option<String> = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=100).contains(l))
                    .ok_or_else(|| {
                        GatewayError::invalid("limit", "`limit` must be an integer from 1 to 100")
                    })?
            }
            "order" => {
                asc = match value {
                    "asc" => true,
                    "desc" => false,
                    _ => {
                        return Err(GatewayError::invalid(
                            "order",
                            "`order` must be asc or desc",
                        ))
                    }
                }
            }
            "after" => after = Some(value.to_owned()),
            // OpenAI's `include` adds optional fields the stored items already carry or lack.
            _ => {}
        }
    }
    let mut ordered: Vec<&Value> = input.iter().collect();
    if !asc {
        ordered.reverse();
    }
    let start = match &after {
        None => 0,
        Some(a) => {
            ordered
                .iter()
                .position(|i| i.get("id").and_then(Value::as_str) == Some(a.as_str()))
                .ok_or_else(|| {
                    GatewayError::invalid(
                        "after",
                        format!("no input item with id '{}'", printable(a)),
                    )
                })?
                + 1
        }
    };
    let page: Vec<Value> = ordered
        .iter()
        .skip(start)
        .take(limit)
        .map(|v| (*v).clone())
        .collect();
    let id_of = |v: Option<&Value>| v.and_then(|i| i.get("id")).cloned().unwrap_or(Value::Null);
    Ok(json!({
        "object": "list",
        "data": page,
        "first_id": id_of(page.first()),
        "last_id": id_of(page.last()),
        "has_more": start + limit < ordered.len(),
    }))
}

/// A JSON answer of the gateway's own.
pub fn json_response(value: &Value) -> Response<Body> {
    let mut resp = Response::new(body::json(value));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The 404 for a response id the key has no record of.
pub fn not_found(id: &str) -> GatewayError {
    GatewayError::new(
        ErrorKind::NotFound,
        format!("Response with id '{}' not found.", printable(id)),
    )
}

/// A store failure on the read path, without the store's details.
pub fn unavailable(e: &StoreError) -> GatewayError {
    store_failed(e)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::*;

    fn user_message_tree(text: String) -> Value {
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    }

    fn ev<'a>(event: Option<&'a str>, data: &'a str) -> EventRef<'a> {
        EventRef { event, data }
    }

    /// The response object of a terminal event, read as a tree; the ids read with it are
    /// those its text holds.
    fn response_of(e: EventRef<'_>) -> Option<Value> {
        let answer = terminal(e)?;
        let again = read_final(&answer.text).unwrap();
        assert_eq!((&answer.id, &answer.output), (&again.id, &again.output));
        Some(serde_json::from_str(&answer.text).unwrap())
    }

    /// A translated record written around the response's text reads back as the record
    /// serde writes, and says which ids it holds.
    #[test]
    fn a_translated_record_written_as_text_reads_back_as_the_record() {
        let response = r#"{"id":"resp_1", "output":[{"id":"msg_2","type":"message"},{"type":"x"},{"id":"fc_3"}],"status":"completed"}"#;
        let input = vec![json!({"id": "msg_1", "role": "user", "content": "hi"})];
        let text = translated_text(response, &serde_json::to_string(&input).unwrap());
        let read: Record = serde_json::from_str(&text).unwrap();
        let by_serde = Record::Translated {
            response: serde_json::from_str(response).unwrap(),
            input: input.clone(),
        };
        let same = serde_json::from_str::<Record>(&serde_json::to_string(&by_serde).unwrap());
        assert_eq!(
            serde_json::to_value(&read).unwrap(),
            serde_json::to_value(same.unwrap()).unwrap()
        );
        let answer = read_final(response).unwrap();
        assert_eq!(answer.id, "resp_1");
        assert_eq!(answer.output, ["msg_2", "fc_3"]);
    }

    /// A head member as far as continuing reads it: absent, a string, or anything else.
    fn view(l: &Loose<'_>) -> Option<Option<String>> {
        match l {
            Loose::Absent => None,
            l => Some(l.as_str().map(str::to_owned)),
        }
    }

    type Viewed = Vec<(Range<usize>, Option<Option<String>>, Option<Option<String>>)>;

    fn comparable(kept: &KeptInput) -> (String, Viewed, Vec<String>) {
        let items = (kept.items.iter())
            .map(|(at, h)| (at.clone(), view(&h.id), view(&h.kind)))
            .collect();
        (kept.text.clone(), items, kept.ids.clone())
    }

    /// Each kept item's place and head are what reading the kept text gives.
    fn assert_index_reads_as_text(kept: &KeptInput, what: &str) {
        let read: Loose<'_, ItemSpan<'_>> = hand::value(&kept.text)
            .or_else(|| serde_json::from_str(&kept.text).ok())
            .unwrap();
        let items = read.as_array().unwrap_or_default();
        assert_eq!(items.len(), kept.items.len(), "{what}");
        for (item, (at, head)) in items.iter().zip(&kept.items) {
            assert_eq!(item.text, kept.text.get(at.clone()), "{what}");
            assert_eq!(view(&item.typed.id), view(&head.id), "{what}: {at:?}");
            assert_eq!(view(&item.typed.kind), view(&head.kind), "{what}: {at:?}");
        }
    }

    fn assert_same_index(decoded: Option<&RecordIndex>, index: &RecordIndex, what: &str) {
        let decoded = decoded.unwrap_or_else(|| panic!("{what}: the encoded index did not decode"));
        let viewed = |i: &RecordIndex| -> Viewed {
            (i.input.iter())
                .map(|(at, h)| (at.clone(), view(&h.id), view(&h.kind)))
                .collect()
        };
        assert_eq!(decoded.response, index.response, "{what}");
        assert_eq!(viewed(decoded), viewed(index), "{what}");
    }

    /// The index Redis keeps decodes to the one encoded, whatever its heads' strings hold; what
    /// is not such an index (another form, another record's length, a place outside the record,
    /// a string cut short or inside a character, anything left over) decodes to none.
    #[test]
    fn a_kept_index_decodes_to_itself_and_nothing_else_decodes() {
        let str = |s: &str| Loose::Str(Cow::Owned(s.to_owned()));
        let index = RecordIndex {
            response: 33..50,
            input: vec![
                (
                    60..70,
                    Head {
                        id: str("msg_1"),
                        kind: str("message"),
                    },
                ),
                (
                    71..71,
                    Head {
                        id: Loose::Absent,
                        kind: Loose::Null,
                    },
                ),
                (
                    72..90,
                    Head {
                        id: str("a b:7 s3:x n"),
                        kind: Loose::Absent,
                    },
                ),
                (
                    91..99,
                    Head {
                        id: str(""),
                        kind: str("é 🦀"),
                    },
                ),
                (
                    99..100,
                    Head {
                        id: Loose::Null,
                        kind: str(" a"),
                    },
                ),
            ],
        };
        let encoded = index.encoded(100);
        assert_same_index(
            RecordIndex::decoded(&encoded, 100).as_ref(),
            &index,
            &encoded,
        );
        let empty = RecordIndex {
            response: 0..0,
            input: Vec::new(),
        };
        assert_same_index(
            RecordIndex::decoded("i1 0 0 0", 0).as_ref(),
            &empty,
            "empty",
        );
        assert_eq!(empty.encoded(0), "i1 0 0 0");
        for bad in [
            "",
            "i2 100 33 50",
            "i1 99 33 50",
            "i1 100 33 101",
            "i1 100 50 33",
            "i1 100 33",
            "i1 100 33 50 60 70 a",
            "i1 100 33 50 60 70 a x",
            "i1 100 33 50 60 70 s5:msg_1 a",
            "i1 100 33 50 60 70 5:msg_ a",
            "i1 100 33 50 60 70 9:msg_1 a",
            "i1 100 33 50 60 70 1:é a",
            "i1 100 33 50 60 70 a a ",
            "i1 100 33 50 60 70 a a 1",
            "i1  100 33 50",
            "i1 +100 33 50",
            "i1 100 33 50 60 70 a n extra",
        ] {
            assert!(RecordIndex::decoded(bad, 100).is_none(), "{bad:?}");
        }
        assert!(RecordIndex::decoded(&encoded, 101).is_none());
    }

    /// The input items as the tree reading kept them, the reference for `input_items`.
    fn input_items_by_tree(body: &[u8], ids: &InputIds) -> Vec<Value> {
        let input = RawObject::parse(body)
            .ok()
            .and_then(|o| o.get_present("input").map(|r| r.get().to_owned()));
        let mut items = match input.as_deref().map(serde_json::from_str::<Value>) {
            Some(Ok(Value::String(s))) => vec![user_message_tree(s)],
            Some(Ok(Value::Array(a))) => a,
            _ => Vec::new(),
        };
        for (place, item) in items.iter_mut().enumerate() {
            complete_item(item, ids, place);
        }
        items
    }

    /// A random minted id's prefix, or the id itself when it was the client's or names its
    /// answer (the same whoever made it).
    fn id_kind(item: &Value, client: &[&str]) -> Option<String> {
        let id = item.get("id")?.as_str()?;
        if client.contains(&id) || ir::answer_named_by(id).is_some() {
            return Some(id.to_owned());
        }
        let prefix = ["msg_", "item_"].into_iter().find(|p| id.starts_with(p))?;
        let minted = &id[prefix.len()..];
        (minted.len() == 24 && minted.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| format!("{prefix}…"))
    }

    /// Kept as the client wrote them, with only a missing id or type written in, the input
    /// items read back as the tree made them, minted ids aside; the ids listed for the index
    /// are those of the items from `own_from` on, but for ids that name their answer, which an
    /// answer the gateway minted gives the items it completes (at their place), and only it.
    #[test]
    fn input_items_kept_as_written_read_back_as_the_trees() {
        let bodies = [
            r#"{"input":"hi"}"#,
            r#"{"model":"m","input":[{"role":"user","content":"hi"}],"store":true}"#,
            r#"{"input":[{"type":"message","id":"msg_1","role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call_output","call_id":"c","output":"x"},{"type":"reasoning","id":5},{"id":null},{},{ },"text",3,null,[1],{"t\u0079pe":"x"},{"\u0069d":"esc"},{"id":"a","id":7},{"id":7,"id":"b"},{"type":null},{"type":"function_call","id":"fc_1"}]}"#,
            r#"{"input":[ {  "role" : "user" , "content":"x" } , {"id":"x" ,"type":"message"} , { "type" : "item_reference" } ]}"#,
            r#"{"input":null}"#,
            r#"{}"#,
            r#"{"input":{"a":1}}"#,
            r#"{"input":[]}"#,
            r#"{"input":"\u00e9t\u00e9"}"#,
        ];
        let client = ["msg_1", "esc", "b", "x", "fc_1"];
        let minted_answer = "resp_0123456789abcdef01234567";
        for answer in ["resp_1", "resp_0123456789ABCDEF01234567", minted_answer] {
            let ids_for = InputIds::new(answer);
            assert_eq!(ids_for.names_answer(), answer == minted_answer);
            for body in bodies {
                let tree = input_items_by_tree(body.as_bytes(), &ids_for);
                for own_from in [0, 1, 3] {
                    let kept = input_items(body.as_bytes(), own_from, &ids_for);
                    assert_index_reads_as_text(&kept, body);
                    let KeptInput { text, ids, .. } = kept;
                    let kept: Vec<Value> = serde_json::from_str(&text).unwrap();
                    assert_eq!(kept.len(), tree.len(), "{body}");
                    for (place, (a, b)) in kept.iter().zip(&tree).enumerate() {
                        let (mut a, mut b) = (a.clone(), b.clone());
                        assert_eq!(
                            id_kind(&a, &client),
                            id_kind(&b, &client),
                            "{body}: {a} / {b}"
                        );
                        if let Some(id) = a.get("id").and_then(Value::as_str) {
                            if let Some(named) = ir::answer_named_by(id) {
                                assert_eq!(named, minted_answer, "{body}: {a}");
                                assert_eq!(&id[id.len() - 8..], format!("{place:08x}"));
                            }
                        }
                        for v in [&mut a, &mut b] {
                            if let Some(o) = v.as_object_mut() {
                                o.remove("id");
                            }
                        }
                        assert_eq!(a, b, "{body}");
                    }
                    let listed: Vec<&str> = (kept.iter().skip(own_from))
                        .filter_map(|i| i.get("id").and_then(Value::as_str))
                        .filter(|id| ir::answer_named_by(id).is_none())
                        .collect();
                    assert_eq!(ids, listed, "{body} from {own_from}");
                    // A string input is written by hand: the bytes serde writes its tree as.
                    if let [Value::Object(item)] = &tree[..] {
                        if item.get("role").is_some_and(|r| r == "user")
                            && body.contains("\"input\":\"")
                        {
                            let mut same = item.clone();
                            same.insert("id".into(), kept[0]["id"].clone());
                            assert_eq!(text, serde_json::to_string(&[same]).unwrap(), "{body}");
                        }
                    }
                }
            }
        }
    }

    /// Only an id of the form [`InputIds`] makes names an answer.
    #[test]
    fn only_ids_made_to_name_their_answer_name_one() {
        let digits = "0123456789abcdef01234567";
        let ids = InputIds::new(&format!("resp_{digits}"));
        assert_eq!(
            ir::answer_named_by(&ids.mint(None, 7)).as_deref(),
            Some(&*format!("resp_{digits}"))
        );
        assert_eq!(
            ids.mint(Some("message"), 7),
            format!("msg_{digits}00000007")
        );
        assert_eq!(
            ids.mint(Some("function_call_output"), 300),
            format!("item_{digits}0000012c")
        );
        for id in [
            format!("msg_{digits}"),
            format!("msg_{digits}0000000"),
            format!("msg_{digits}000000070"),
            format!("msg_{digits}0000000G"),
            format!("msg_{}00000007", digits.to_uppercase()),
            format!("call_{digits}00000007"),
            format!("resp_{digits}00000007"),
            // The 32 digits' start falls inside a character.
            format!("msg\u{e9}{digits}0000007"),
        ] {
            assert_eq!(ir::answer_named_by(&id), None, "{id}");
        }
        for answer in [
            "resp_1",
            "chatcmpl-x",
            "",
            &format!("resp_{digits}0"),
            &format!("msg_{digits}"),
        ] {
            let random = InputIds::new(answer);
            assert!(!random.names_answer(), "{answer}");
            assert_eq!(ir::answer_named_by(&random.mint(None, 0)), None, "{answer}");
        }
    }

    /// The tree reading's expansion, the reference for [`expanded`]: the history's items, then
    /// the request's own, each reference replaced by the first item before it with its id, else
    /// by the item `index` holds under that id.
    fn expanded_by_tree(history: &[Value], input: &Value, index: &[(&str, &str)]) -> Vec<Value> {
        let mut items = history.to_vec();
        let own = match input {
            Value::String(s) => vec![user_message_tree(s.clone())],
            Value::Array(a) => a.clone(),
            _ => Vec::new(),
        };
        for mut item in own {
            if item.get("type").and_then(Value::as_str) == Some("item_reference") {
                if let Some(id) = item.get("id").and_then(Value::as_str) {
                    let before = items
                        .iter()
                        .find(|i| i.get("id").and_then(Value::as_str) == Some(id))
                        .cloned();
                    let indexed = index.iter().find(|(i, _)| *i == id);
                    if let Some(found) = before
                        .or_else(|| indexed.map(|(_, text)| serde_json::from_str(text).unwrap()))
                    {
                        item = found;
                    }
                }
            }
            items.push(item);
        }
        items
    }

    /// Continuing from a stored record by copying items as their texts gives the items the
    /// tree reading gave, for every kind of history, input and reference.
    #[test]
    fn a_continuation_copied_as_text_reads_back_as_the_trees() {
        let responses = [
            r#"{"id":"resp_1","output":[{"id":"msg_o","type":"message","content":[{"type":"output_text","text":"out"}]},{"type":"reasoning","id":"rs_1","summary":[]},7,{"id":"msg_d","v":1}],"status":"completed"}"#,
            r#"{"id":"resp_2","output":null}"#,
            r#"{ "output" : [ { "id" : "msg_d" , "v" : 2 } ] }"#,
        ];
        let inputs = [
            r#"[{"id":"msg_a","role":"user","content":"a"},{"id":"msg_d","v":0},"text",null,{"id":5},{"\u0069d":"msg_e","k":1},{"id":"msg_x","id":"msg_y"}]"#,
            r#"[]"#,
        ];
        let own = [
            r#""just text""#,
            r#""\u00e9t\u00e9 \"q\"""#,
            r#"[{"type":"item_reference","id":"msg_o"},{"role":"user","content":"q"}]"#,
            r#"[{"type":"item_reference","id":"msg_d"},{"type":"item_reference","id":"msg_e"},{"type":"item_reference","id":"msg_y"},{"type":"item_reference","id":"msg_x"}]"#,
            r#"[{"type":"item_reference","id":"idx_1"},{"type":"item_reference","id":"idx_1"},{"type":"item_reference","id":"nope"},{"type":"item_reference"},{"type":"item_reference","id":7}]"#,
            r#"[{"id":"own_1","role":"user","content":"mine"},{"type":"item_reference","id":"own_1"},{"type":"item_reference","id":"idx_2"},{"id":"idx_2","role":"user","content":"later"}]"#,
            r#"[ { "type" : "item_reference" , "id" : "rs_1" } , 3 , "s" , [1] , { } ]"#,
            r#"[{"type":"item_reference","id":"msg_\u006f"},{"type":"item_\u0072eference","id":"msg_o"}]"#,
            r#"[]"#,
        ];
        let index = [
            (
                "idx_1",
                r#"{"id":"idx_1","type":"message","role":"assistant","content":"from the index"}"#,
            ),
            (
                "idx_2",
                r#"{"id":"idx_2","type":"function_call","call_id":"c","name":"f","arguments":"{}"}"#,
            ),
            // An item before the reference wins over the index's.
            ("msg_o", r#"{"id":"msg_o","from":"the index"}"#),
            ("own_1", r#"{"id":"own_1","from":"the index"}"#),
        ];
        // The index's items as a record's items are read.
        let index_items: Vec<String> = index.iter().map(|(_, item)| format!("[{item}]")).collect();
        let index_spans: Vec<Loose<'_, ItemSpan<'_>>> = (index_items.iter())
            .map(|items| hand::value(items).unwrap())
            .collect();
        let resolved: HashMap<&str, &ItemSpan<'_>> = (index.iter().zip(&index_spans))
            .map(|((id, _), items)| (*id, &items.as_array().unwrap()[0]))
            .collect();
        let mut compared = 0;
        for response in responses {
            for input in inputs {
                let record_text = translated_text(response, input);
                let record = StoredRecord::read(&record_text).unwrap();
                let history: Vec<&ItemSpan<'_>> = record.items().collect();
                let Record::Translated {
                    response: tree,
                    input: tree_input,
                } = serde_json::from_str(&record_text).unwrap()
                else {
                    panic!("{record_text}")
                };
                let mut history_tree = tree_input;
                if let Some(output) = tree.get("output").and_then(Value::as_array) {
                    history_tree.extend(output.iter().cloned());
                }
                assert_eq!(history.len(), history_tree.len(), "{record_text}");
                for own_text in own {
                    let loose: Loose<'_, ItemSpan<'_>> = hand::value(own_text)
                        .or_else(|| serde_json::from_str(own_text).ok())
                        .unwrap();
                    let own_items = loose.as_array().unwrap_or_default();
                    let expansion = expanded(&history, &loose, own_items, &resolved, true);
                    let text = &expansion.text;
                    let got: Value = serde_json::from_str(text).unwrap();
                    let want = expanded_by_tree(
                        &history_tree,
                        &serde_json::from_str(own_text).unwrap(),
                        &index,
                    );
                    assert_eq!(got, Value::Array(want), "{record_text} + {own_text}");
                    // Kept from what planning read, the input is what reading it again keeps.
                    let body = format!(r#"{{"input":{text}}}"#);
                    let ids = InputIds::new("resp_0123456789abcdef01234567");
                    for own_from in [0, history.len(), history.len() + 1] {
                        let what = format!("{record_text} + {own_text} from {own_from}");
                        let kept = expansion.stored(own_from, &ids);
                        assert_eq!(
                            comparable(&kept),
                            comparable(&input_items(body.as_bytes(), own_from, &ids)),
                            "{what}"
                        );
                        assert_index_reads_as_text(&kept, &what);
                        // The next turn reads this record from its index as from its text.
                        let text = translated_text(response, &kept.text);
                        let index = record_index(response, kept.items);
                        // And from the index as Redis keeps it.
                        let decoded = RecordIndex::decoded(&index.encoded(text.len()), text.len());
                        assert_same_index(decoded.as_ref(), &index, &what);
                        let entry = Entry {
                            index: Some(index),
                            text,
                        };
                        let indexed = StoredRecord::of(&entry).unwrap();
                        let read = StoredRecord::read(&entry.text).unwrap();
                        assert!(matches!(indexed, StoredRecord::Translated(_)), "{what}");
                        let heads = |r: &StoredRecord<'_>| -> Vec<_> {
                            (r.items())
                                .map(|i| {
                                    let text = i.text.map(str::to_owned);
                                    (text, view(&i.typed.id), view(&i.typed.kind))
                                })
                                .collect()
                        };
                        assert_eq!(heads(&indexed), heads(&read), "{what}");
                        compared += heads(&read).len();
                    }
                }
            }
        }
        // Every case compared item by item: 3 responses × 2 inputs × 9 own × 3 places.
        assert!(compared > 300, "{compared}");
    }

    /// A stored record is read as serde reads it, or refused where serde fails.
    #[test]
    fn stored_records_are_read_where_serde_reads_them() {
        let texts = [
            r#"{"kind":"translated","response":{"output":[]},"input":[]}"#,
            r#"{"kind":"translated","response":null,"input":[{"id":"a"}]}"#,
            r#"{"input":[],"response":7,"kind":"translated"}"#,
            r#"{"kind":"passthrough","upstream":"up-1"}"#,
            r#"{"kind":"passthrough","upstream":"\u0075p"}"#,
            r#"{"kind":"translated","input":[]}"#,
            r#"{"kind":"translated","response":{},"input":null}"#,
            r#"{"kind":"translated","response":{},"input":{}}"#,
            r#"{"kind":"passthrough"}"#,
            r#"{"kind":"passthrough","upstream":3}"#,
            r#"{"kind":"other","upstream":"u"}"#,
            r#"{"upstream":"u"}"#,
            r#"[]"#,
            r#"not json"#,
        ];
        for text in texts {
            let by_serde = serde_json::from_str::<Record>(text);
            match (StoredRecord::read(text), by_serde) {
                (Ok(StoredRecord::Passthrough(a)), Ok(Record::Passthrough { upstream })) => {
                    assert_eq!(a, upstream, "{text}");
                }
                (Ok(StoredRecord::Translated(_)), Ok(Record::Translated { .. }))
                | (Err(_), Err(_)) => {}
                (mine, serde) => panic!("{text}: {} / {serde:?}", mine.is_ok()),
            }
        }
    }

    /// What the watch found in one frame, as text to compare.
    type Found = Result<Option<String>, EventTooLarge>;

    /// The watch's reference: every frame decoded.
    fn decoding_every_frame(decoder: &mut SseDecoder, data: &[u8]) -> Found {
        let mut response = None;
        decoder.feed_with(data, |ev| {
            if response.is_none() {
                response = terminal(ev);
            }
        })?;
        Ok(response.map(|r| r.text.into()))
    }

    /// However a stream is cut into frames, the watch finds in each frame what decoding every
    /// frame finds: a frame it leaves undecoded never held a terminal event, nor part of one.
    #[test]
    fn frames_left_undecoded_never_hold_what_decoding_finds() {
        let events = [
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"note\":\"response.completed\"}}\n\n",
            ": keep-alive\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"response.failed is a name\"}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\n",
            "data: \"delta\":\"two lines\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\"}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"second\"}}\n\n",
        ];
        let lf = events.concat();
        let streams = [lf.clone(), lf.replace('\n', "\r\n"), lf.replace('\n', "\r")];
        // The first event boundaries, for frames that each hold whole events.
        let mut whole = vec![0];
        for e in &events {
            whole.push(whole.last().unwrap() + e.len());
        }
        let mut state = 7_u64;
        let mut random = |below: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as usize % below
        };
        for stream in &streams {
            let bytes = stream.as_bytes();
            let mut cuttings: Vec<Vec<usize>> = (1..bytes.len()).map(|at| vec![at]).collect();
            cuttings.extend((1..=40).map(|size| (size..bytes.len()).step_by(size).collect()));
            cuttings.push(whole[1..whole.len() - 1].to_vec());
            for _ in 0..500 {
                let mut cuts: Vec<usize> = (0..4).map(|_| 1 + random(bytes.len() - 1)).collect();
                cuts.sort_unstable();
                cuts.dedup();
                cuttings.push(cuts);
            }
            for limit in [64, 4096] {
                for cuts in &cuttings {
                    let mut watch = TerminalWatch::Read(SseDecoder::with_limit(limit));
                    let mut reference = SseDecoder::with_limit(limit);
                    let mut from = 0;
                    for &to in cuts.iter().chain([&bytes.len()]) {
                        let frame = &bytes[from..to];
                        let found: Found = watch.frame(frame).map(|r| r.map(|r| r.text.into()));
                        assert_eq!(
                            found,
                            decoding_every_frame(&mut reference, frame),
                            "{cuts:?} at {from}..{to} (limit {limit})"
                        );
                        from = to;
                    }
                }
            }
        }
    }

    #[test]
    fn only_a_terminal_event_gives_its_response() {
        let done = r#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","status":"completed"}}"#;
        let want = json!({"id": "resp_1", "status": "completed"});
        // Named or not, whatever the order of its members.
        assert_eq!(
            response_of(ev(Some("response.completed"), done)),
            Some(want.clone())
        );
        assert_eq!(response_of(ev(None, done)), Some(want.clone()));
        let reordered =
            r#"{"response": {"id":"resp_1","status":"completed"}, "type": "response.completed"}"#;
        assert_eq!(response_of(ev(Some("message"), reordered)), Some(want));
        // Its ids are read with its text, by hand or (an escaped key) by serde.
        for data in [
            r#"{"type":"response.completed","response":{"id":"r","output":[{"id":"msg_1"},{"type":"x"},{"id":"fc_2"}]}}"#,
            r#"{"type":"response.completed","response":{"id":"r","output":[{"id":"msg_1"},{"t\u0079pe":"x"},{"id":"fc_2"}]}}"#,
        ] {
            let answer = terminal(ev(None, data)).unwrap();
            assert_eq!(answer.id, "r", "{data}");
            assert_eq!(answer.output, ["msg_1", "fc_2"], "{data}");
            assert!(response_of(ev(None, data)).is_some());
        }
        for kind in ["response.incomplete", "response.failed"] {
            let data = format!(r#"{{"type":"{kind}","response":{{"id":"r"}}}}"#);
            assert_eq!(
                response_of(ev(None, &data)),
                Some(json!({"id": "r"})),
                "{kind}"
            );
        }
        // Not terminal: a delta that names a terminal type in its text, a response event that
        // is not the last, an event that is not JSON.
        let delta = r#"{"type":"response.output_text.delta","delta":"\"response.completed\""}"#;
        assert_eq!(
            response_of(ev(Some("response.output_text.delta"), delta)),
            None
        );
        let created = r#"{"type":"response.created","response":{"id":"r","status":"in_progress","x":"response.completed"}}"#;
        assert_eq!(response_of(ev(Some("response.created"), created)), None);
        assert_eq!(
            response_of(ev(Some("response.completed"), "response.completed")),
            None
        );
    }
}
