//! Joins the data frames a body already holds into one frame, so a burst of events that arrived together leaves in one write, and never waits for more.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// Frames are joined up to this size; a larger burst goes on in several frames.
const MAX_JOINED: usize = 64 * 1024;

/// A body whose every data frame carries all the data its inner body had ready when polled.
/// HTTPS upstreams go through hyper's client, which hands a body over one HTTP/2 DATA frame (or
/// one HTTP/1.1 chunk) at a time; this does for them what the plain-HTTP client's de-framing does
/// for a read of many chunks.
pub struct Coalesce<B: Body> {
    inner: B,
    /// What ended a run of data frames, given out on the next poll.
    held: Option<Option<Result<Frame<Bytes>, B::Error>>>,
}

impl<B: Body> Coalesce<B> {
    pub fn new(inner: B) -> Self {
        Self { inner, held: None }
    }
}

impl<B> Body for Coalesce<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(held) = this.held.take() {
            return Poll::Ready(held);
        }
        let first = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            },
            other => return Poll::Ready(other),
        };
        let mut joined: Option<BytesMut> = None;
        loop {
            let len = joined.as_ref().map_or(first.len(), BytesMut::len);
            if len >= MAX_JOINED || this.inner.is_end_stream() {
                break;
            }
            // A pending poll leaves the waker registered, which is all it costs: the caller polls
            // again once it has written this frame.
            let next = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        this.held = Some(Some(Ok(frame)));
                        break;
                    }
                },
                Poll::Ready(other) => {
                    this.held = Some(other);
                    break;
                }
            };
            joined
                .get_or_insert_with(|| {
                    let mut buf = BytesMut::with_capacity(first.len() + next.len());
                    buf.extend_from_slice(&first);
                    buf
                })
                .extend_from_slice(&next);
        }
        let data = joined.map_or(first, BytesMut::freeze);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        match &self.held {
            Some(None) => true,
            Some(Some(_)) => false,
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.held {
            None => self.inner.size_hint(),
            Some(None) => SizeHint::with_exact(0),
            Some(Some(_)) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::VecDeque;
    use std::task::Waker;

    use super::*;

    type Answer = Poll<Option<Result<Frame<Bytes>, &'static str>>>;

    /// A body that answers each poll with the next scripted answer.
    struct Scripted(VecDeque<Answer>);

    impl Body for Scripted {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Answer {
            self.0.pop_front().unwrap_or(Poll::Ready(None))
        }
    }

    fn data(s: &str) -> Answer {
        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(s.as_bytes())))))
    }

    /// Polls to the end: each answer as text, `-` for pending, `!e` for an error, `T` for
    /// trailers.
    fn run(script: Vec<Answer>) -> Vec<String> {
        let mut body = Coalesce::new(Scripted(script.into()));
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        for _ in 0..32 {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Pending => out.push("-".to_owned()),
                Poll::Ready(None) => return out,
                Poll::Ready(Some(Err(e))) => out.push(format!("!{e}")),
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => out.push(String::from_utf8(d.to_vec()).unwrap()),
                    Err(_) => out.push("T".to_owned()),
                },
            }
        }
        panic!("no end: {out:?}");
    }

    #[test]
    fn ready_frames_are_joined_and_a_pending_poll_ends_the_run() {
        let got = run(vec![
            data("a"),
            data("b"),
            data("c"),
            Poll::Pending,
            data("d"),
            Poll::Pending,
            Poll::Pending,
            data("e"),
            data("f"),
        ]);
        assert_eq!(got, ["abc", "d", "-", "ef"]);
    }

    #[test]
    fn an_error_trailers_or_the_end_come_after_the_data_before_them() {
        assert_eq!(
            run(vec![data("a"), data("b"), Poll::Ready(Some(Err("cut")))]),
            ["ab", "!cut"]
        );
        let trailers = Poll::Ready(Some(Ok(Frame::trailers(http::HeaderMap::new()))));
        assert_eq!(run(vec![data("a"), trailers, data("z")]), ["a", "T", "z"]);
        assert_eq!(run(vec![data("a"), data("b")]), ["ab"]);
    }

    #[test]
    fn a_burst_larger_than_the_cap_leaves_in_several_frames() {
        let big = "x".repeat(MAX_JOINED / 2 + 1);
        let got = run(vec![data(&big), data(&big), data(&big), data("y")]);
        assert_eq!(
            got.len(),
            2,
            "{:?}",
            got.iter().map(String::len).collect::<Vec<_>>()
        );
        assert_eq!(got[0].len(), 2 * big.len());
        assert_eq!(got[1], format!("{big}y"));
    }
}
