//! Server-sent events: an incremental decoder that accepts any split of the bytes, and the encoder's framing helpers.

/// One dispatched event: its `event:` name (if any) and its `data:` lines joined with `\n`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// An event as the decoder hands it over: borrowed from its buffers, valid until the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRef<'a> {
    pub event: Option<&'a str>,
    pub data: &'a str,
}

impl EventRef<'_> {
    /// The event with its own copies of its name and data, to keep past the next one.
    pub fn owned(self) -> SseEvent {
        SseEvent {
            event: self.event.map(str::to_owned),
            data: self.data.to_owned(),
        }
    }
}

/// Decodes an event stream fed in arbitrary pieces (WHATWG rules: `\n`, `\r\n` or `\r` line ends,
/// `:` comments, repeated `data:` joined by `\n`, one leading space after the colon stripped).
///
/// Lines are read where they arrive; only a line still open at the end of a piece is copied, to
/// be completed by the next. The event's name and data are gathered in buffers kept for the
/// whole stream, so a stream of events costs no allocation per event.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// The start of a line whose end has not arrived; never holds a line end.
    partial: Vec<u8>,
    event: Vec<u8>,
    has_event: bool,
    data: Vec<u8>,
    has_data: bool,
    /// A `\r` ended the last line; a `\n` right after it belongs to the same line end.
    pending_cr: bool,
    max_event: Option<usize>,
}

/// An upstream event passed the decoder's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an upstream event is larger than the limit of {0} bytes")]
pub struct EventTooLarge(pub usize);

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that refuses an event longer than `max_event` bytes (its data plus the line
    /// still arriving), so a stream without line breaks cannot grow memory without bound.
    pub fn with_limit(max_event: usize) -> Self {
        Self {
            max_event: Some(max_event),
            ..Self::default()
        }
    }

    /// Feeds bytes; complete events are appended to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), EventTooLarge> {
        self.feed_with(bytes, |ev| out.push(ev.owned()))
    }

    /// Feeds bytes; `each` gets every event they complete, in order. Each byte is searched for
    /// a line end once, however the stream is split, so the work is linear in the input.
    pub fn feed_with(
        &mut self,
        mut bytes: &[u8],
        mut each: impl FnMut(EventRef<'_>),
    ) -> Result<(), EventTooLarge> {
        if self.pending_cr && !bytes.is_empty() {
            self.pending_cr = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..];
            }
        }
        let mut start = 0;
        for end in memchr::memchr2_iter(b'\n', b'\r', bytes) {
            // A CRLF's LF: the line ended at its CR.
            if end == start && self.pending_cr && bytes[end] == b'\n' {
                self.pending_cr = false;
                start = end + 1;
                continue;
            }
            self.pending_cr = bytes[end] == b'\r';
            let piece = &bytes[start..end];
            start = end + 1;
            if self.partial.is_empty() {
                self.line(piece, &mut each);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(piece);
                self.line(&line, &mut each);
                line.clear();
                self.partial = line;
            }
        }
        if start < bytes.len() {
            // The piece ends inside a line: whatever the next byte is, it is not a CRLF's LF.
            self.pending_cr = false;
            self.partial.extend_from_slice(&bytes[start..]);
        }
        match self.max_event {
            Some(max) if self.data.len() + self.partial.len() > max => Err(EventTooLarge(max)),
            _ => Ok(()),
        }
    }

    /// Between events: no line, field or line end of one begun. Bytes fed from here that end
    /// with an empty line leave the decoder here again, so skipping them loses nothing else.
    pub fn is_idle(&self) -> bool {
        self.partial.is_empty() && !self.has_data && !self.has_event && !self.pending_cr
    }

    /// Ends the stream: a final event without its blank line is still dispatched (as browsers do not,
    /// but a truncated upstream's last complete data line is better surfaced than lost).
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        self.finish_with(|ev| out.push(ev.owned()));
    }

    /// [`finish`](Self::finish), handing the last event to `each`.
    pub fn finish_with(&mut self, mut each: impl FnMut(EventRef<'_>)) {
        self.pending_cr = false;
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut each);
        }
        self.dispatch(&mut each);
    }

    fn line(&mut self, line: &[u8], each: &mut impl FnMut(EventRef<'_>)) {
        if line.is_empty() {
            self.dispatch(each);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
                self.has_event = true;
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, each: &mut impl FnMut(EventRef<'_>)) {
        if self.has_data {
            let data = text(&self.data);
            let event = self.has_event.then(|| text(&self.event));
            each(EventRef {
                event: event.as_deref(),
                data: &data,
            });
        }
        self.data.clear();
        self.has_data = false;
        self.event.clear();
        self.has_event = false;
    }
}

/// Bytes as text, invalid UTF-8 replaced as a browser's decoder replaces it. Lines end at
/// ASCII bytes, so replacing in data joined from several lines gives what replacing line by
/// line would. Valid text, nearly all of it, is checked by the standard library's word-at-a-
/// time check; the lossy conversion goes byte by byte, several times slower.
fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Finds where events end (just after their blank line) in a stream fed in arbitrary pieces,
/// whatever its line ends (`\n`, `\r\n`, `\r`), looking at each byte once: what passes events
/// through without decoding them measures and cuts them with it.
#[derive(Debug)]
pub struct EventEnds {
    /// The current line has bytes: a line end here does not end an event.
    in_line: bool,
    /// The last byte was a `\r` line end: a `\n` right after it belongs to it.
    after_cr: bool,
    /// Nothing came since the last event's end (or the stream's start).
    at_event_end: bool,
}

impl Default for EventEnds {
    fn default() -> Self {
        Self {
            in_line: false,
            after_cr: false,
            at_event_end: true,
        }
    }
}

impl EventEnds {
    /// Feeds the next piece; `each` gets the offset (in `data`) just after every event's end.
    pub fn feed(&mut self, data: &[u8], each: impl FnMut(usize)) {
        self.feed_lines(data, each, |_| {});
    }

    /// As `feed`, and `line` gets the offset just after every line end (a line start, or the
    /// `\n` of a CRLF), in the same pass.
    pub fn feed_lines(
        &mut self,
        data: &[u8],
        mut each: impl FnMut(usize),
        mut line: impl FnMut(usize),
    ) {
        let mut line_start = 0;
        for i in memchr::memchr2_iter(b'\n', b'\r', data) {
            let content = i > line_start;
            line_start = i + 1;
            line(i + 1);
            if content {
                self.in_line = true;
            } else if data[i] == b'\n' && self.after_cr {
                self.after_cr = false;
                continue;
            }
            self.at_event_end = !self.in_line;
            if self.at_event_end {
                each(i + 1);
            }
            self.in_line = false;
            self.after_cr = data[i] == b'\r';
        }
        if line_start < data.len() {
            self.in_line = true;
            self.after_cr = false;
            self.at_event_end = false;
        }
    }

    /// True when every line end in `data` is a lone LF: it has no `\r` and the piece before it
    /// did not end with one.
    pub fn lf_only(&self, data: &[u8]) -> bool {
        !self.after_cr && memchr::memchr(b'\r', data).is_none()
    }

    /// [`feed`](Self::feed) for a piece that is [`lf_only`](Self::lf_only), when only the last
    /// event end matters: found from the piece's end, so its lines are not visited one by one.
    pub fn feed_lf_whole(&mut self, data: &[u8]) -> Option<usize> {
        // An event ends at a line end that closes an empty line: the second LF of a pair, or a
        // first LF when the piece before it ended a line.
        let last = memchr::memmem::rfind(data, b"\n\n")
            .map(|i| i + 2)
            .or_else(|| (data.first() == Some(&b'\n') && !self.in_line).then_some(1));
        match data.last() {
            Some(b'\n') => {
                self.in_line = false;
                self.at_event_end = last == Some(data.len());
            }
            Some(_) => {
                self.in_line = true;
                self.at_event_end = false;
            }
            None => {}
        }
        last
    }

    /// True when what was fed so far ends at an event's end (or is nothing): an event written
    /// next needs no blank line before it.
    pub fn at_event_end(&self) -> bool {
        self.at_event_end
    }

    /// Feeds the next piece; where the last event that ends in it ends.
    pub fn last_end(&mut self, data: &[u8]) -> Option<usize> {
        if self.lf_only(data) {
            return self.feed_lf_whole(data);
        }
        let mut last = None;
        self.feed(data, |end| last = Some(end));
        last
    }
}

/// Writes one event: `event: <name>` (when given) and `data: <json>`, then the blank line.
pub fn write_event(out: &mut Vec<u8>, name: Option<&str>, data: &[u8]) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

/// Writes a serialisable value as one event's data.
pub fn write_json_event<T: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    name: Option<&str>,
    value: &T,
) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Serialising plain data into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests;
