//! Reading what a stranger's server sends without holding more than a set number of bytes: a
//! tool or a model that streams gigabytes costs the worker at most the cap.

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

/// A body read up to a cap.
pub struct Capped {
    pub bytes: Bytes,
    /// More was sent than the cap; it was not read.
    pub truncated: bool,
}

impl Capped {
    /// The body as text (lossy: a cut may split a character, and servers send anything).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads `response`'s body until its end or `cap` bytes, whichever comes first; the rest is
/// never read (the connection is dropped with it).
pub async fn read(response: reqwest::Response, cap: usize) -> Result<Capped, reqwest::Error> {
    let mut body = response.bytes_stream();
    let mut buf = BytesMut::with_capacity(cap.min(16 * 1024));
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        let room = cap - buf.len();
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            return Ok(Capped {
                bytes: buf.freeze(),
                truncated: true,
            });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Capped {
        bytes: buf.freeze(),
        truncated: false,
    })
}

/// The stream went past its cap.
#[derive(Debug, thiserror::Error)]
#[error("more than {0} bytes")]
pub struct TooLarge(pub usize);

/// `stream` that fails with [`TooLarge`] once more than `cap` bytes have passed through it, so
/// a parser buffering it (an SSE decoder waiting for a newline) never holds more.
pub fn limit<S, E>(stream: S, cap: usize) -> impl Stream<Item = Result<Bytes, LimitError<E>>>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    // State: bytes seen so far, or `None` once the cap was passed (then the stream ends).
    stream.scan(Some(0usize), move |seen, item| {
        let Some(total) = seen else {
            return futures_util::future::ready(None);
        };
        let item = match item {
            Ok(chunk) if *total + chunk.len() > cap => {
                *seen = None;
                Err(LimitError::TooLarge(TooLarge(cap)))
            }
            Ok(chunk) => {
                *total += chunk.len();
                Ok(chunk)
            }
            Err(e) => Err(LimitError::Inner(e)),
        };
        futures_util::future::ready(Some(item))
    })
}

#[derive(Debug, thiserror::Error)]
pub enum LimitError<E> {
    #[error(transparent)]
    TooLarge(TooLarge),
    #[error("a line of the stream is not UTF-8")]
    NotUtf8,
    #[error(transparent)]
    Inner(E),
}

/// `stream` cut again at every line end (LF or CR), one line an item, each checked as UTF-8.
///
/// For the SSE decoder (`eventsource-stream`): it parses its whole unparsed buffer again on
/// every item it is given, copies what follows each line it takes off, and keeps bytes that
/// are not UTF-8 for ever, re-checking them on every item. A server sending a long line a byte
/// per chunk, or thousands of lines in one chunk, or one bad byte then anything, would cost it
/// time quadratic in what it sent. Given one line at a time, it never holds more than that
/// line. A CR LF pair may be cut between two items: the decoder waits for what follows a CR.
pub fn lines<S, E>(stream: S) -> impl Stream<Item = Result<Bytes, LimitError<E>>>
where
    S: Stream<Item = Result<Bytes, LimitError<E>>>,
{
    struct Lines<S> {
        inner: std::pin::Pin<Box<S>>,
        buf: BytesMut,
        /// The bytes of `buf` already searched for a line end.
        scanned: usize,
        ended: bool,
    }
    let checked = |line: Bytes| match std::str::from_utf8(&line) {
        Ok(_) => Ok(line),
        Err(_) => Err(LimitError::NotUtf8),
    };
    let state = Lines {
        inner: Box::pin(stream),
        buf: BytesMut::new(),
        scanned: 0,
        ended: false,
    };
    futures_util::stream::unfold(state, move |mut st| async move {
        loop {
            let end = st.buf[st.scanned..]
                .iter()
                .position(|&b| b == b'\n' || b == b'\r');
            if let Some(at) = end {
                // A flood of short lines would otherwise keep the decoder's loop (it takes every
                // line that is ready in one poll) on a runtime thread for as long as they last:
                // this yields once the task has used its share of the runtime.
                tokio::task::coop::consume_budget().await;
                let line = st.buf.split_to(st.scanned + at + 1).freeze();
                st.scanned = 0;
                let item = checked(line);
                if item.is_err() {
                    (st.ended, st.buf) = (true, BytesMut::new());
                }
                return Some((item, st));
            }
            st.scanned = st.buf.len();
            if st.ended {
                if st.buf.is_empty() {
                    return None;
                }
                let rest = st.buf.split().freeze();
                st.scanned = 0;
                return Some((checked(rest), st));
            }
            match st.inner.next().await {
                Some(Ok(chunk)) => st.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    (st.ended, st.buf) = (true, BytesMut::new());
                    return Some((Err(e), st));
                }
                None => st.ended = true,
            }
        }
    })
}

/// Lines (from [`lines`]) made safe for the SSE decoder (`eventsource-stream` 0.2), which the
/// remote side could otherwise make panic or copy without end:
/// - a leading byte-order mark is taken off here: the decoder cuts one byte off its three and
///   panics on the broken character (a line that still starts with one after that is a field
///   with an unknown name: it becomes a comment, as the decoder would ignore it anyway);
/// - `id` and `retry` fields become comments: the decoder copies the last `id` at every blank
///   line, so one huge id and then a flood of blank lines would cost a copy of it per line. The
///   worker uses neither field. A comment keeps the line's end, so a CR still pairs with the LF
///   after it.
pub fn for_sse<S, E>(lines: S) -> impl Stream<Item = Result<Bytes, LimitError<E>>>
where
    S: Stream<Item = Result<Bytes, LimitError<E>>>,
{
    const BOM: &[u8] = "\u{feff}".as_bytes();
    // Whether the decoder has seen a non-empty line yet (only its first is checked for a BOM).
    lines.scan(false, |started, item| {
        let item = item.map(|mut line| {
            if !*started {
                if line.starts_with(BOM) {
                    line = line.slice(BOM.len()..);
                }
                *started = !line.is_empty();
                if line.starts_with(BOM) {
                    return comment_like(&line);
                }
            }
            if is_field(&line, b"id") || is_field(&line, b"retry") {
                comment_like(&line)
            } else {
                line
            }
        });
        futures_util::future::ready(Some(item))
    })
}

/// Whether the SSE line is field `name` (its name ends at a colon or at the line's end).
fn is_field(line: &[u8], name: &[u8]) -> bool {
    line.strip_prefix(name)
        .is_some_and(|rest| matches!(rest.first(), None | Some(b':' | b'\n' | b'\r')))
}

/// An empty comment ending as `line` ends.
fn comment_like(line: &[u8]) -> Bytes {
    match line.last() {
        Some(b'\n') => Bytes::from_static(b":\n"),
        Some(b'\r') => Bytes::from_static(b":\r"),
        _ => Bytes::from_static(b":"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn cut(chunks: &[&[u8]]) -> Vec<Result<Bytes, LimitError<std::io::Error>>> {
        let chunks: Vec<_> = chunks
            .iter()
            .map(|c| Ok::<_, LimitError<std::io::Error>>(Bytes::copy_from_slice(c)))
            .collect();
        lines(futures_util::stream::iter(chunks)).collect().await
    }

    #[tokio::test]
    async fn lines_come_one_an_item_however_the_chunks_fall() {
        let got = cut(&[b"da", b"ta: a\n\nda", b"ta: b\r\n\r", b"\n", b"tail"]).await;
        let got: Vec<_> = got.into_iter().map(|r| r.unwrap()).collect();
        let want: Vec<&[u8]> = vec![
            b"data: a\n",
            b"\n",
            b"data: b\r",
            b"\n",
            b"\r",
            b"\n",
            b"tail",
        ];
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_line_that_is_not_utf8_fails_and_ends_the_stream() {
        let got = cut(&[b"data: ok\n", b"data: \xff\n", b"data: later\n"]).await;
        assert_eq!(got.len(), 2, "one line, then the error, then the end");
        assert!(got[0].is_ok());
        assert!(matches!(got[1], Err(LimitError::NotUtf8)));
    }

    #[tokio::test]
    async fn a_long_line_a_byte_a_chunk_reaches_the_decoder_once() {
        // 200,000 one-byte chunks: the decoder would have parsed its buffer again on each.
        let mut chunks: Vec<&[u8]> = vec![b"x"; 200_000];
        chunks.push(b"\n");
        let got = cut(&chunks).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().len(), 200_001);
    }

    /// What the SSE decoder makes of `chunks` after [`lines`] and [`for_sse`]: each event's
    /// data and id.
    async fn decoded(chunks: &[&[u8]]) -> Vec<(String, String)> {
        use eventsource_stream::Eventsource;
        let chunks: Vec<_> = chunks
            .iter()
            .map(|c| Ok::<_, LimitError<std::io::Error>>(Bytes::copy_from_slice(c)))
            .collect();
        for_sse(lines(futures_util::stream::iter(chunks)))
            .eventsource()
            .map(|e| {
                let e = e.expect("event");
                (e.data, e.id)
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_leading_byte_order_mark_is_taken_off_before_the_decoder_sees_it() {
        // eventsource-stream 0.2 slices one byte off the three of a BOM and panics.
        let bom = "\u{feff}";
        let got = decoded(&[format!("{bom}data: a\n\n").as_bytes()]).await;
        assert_eq!(got, [("a".to_owned(), String::new())]);
        // A BOM alone in the first chunk, then a second one: a field of an unknown name.
        let got = decoded(&[
            bom.as_bytes(),
            format!("{bom}data: x\n\ndata: b\n\n").as_bytes(),
        ])
        .await;
        assert_eq!(got, [("b".to_owned(), String::new())]);
    }

    #[tokio::test]
    async fn id_and_retry_fields_never_reach_the_decoder() {
        // A huge id followed by many blank lines: the decoder would copy the id at each.
        let id = format!("id: {}\n", "a".repeat(100_000));
        let blanks = "\n".repeat(1000);
        let got = decoded(&[
            id.as_bytes(),
            blanks.as_bytes(),
            b"retry: 5\r\ndata: a\r\n",
            b"id:7\r",
            b"\ndata: b\r\n\r\n",
        ])
        .await;
        // The CR LF after the id still ends one line: `a` and `b` are one event's two lines.
        assert_eq!(got, [("a\nb".to_owned(), String::new())]);
        let passed: Vec<Bytes> = for_sse(lines(futures_util::stream::iter([Ok::<
            _,
            LimitError<std::io::Error>,
        >(
            Bytes::from_static(b"id\nidle: 1\nretry\r\n"),
        )])))
        .map(Result::unwrap)
        .collect()
        .await;
        let want: Vec<&[u8]> = vec![b":\n", b"idle: 1\n", b":\r", b"\n"];
        assert_eq!(passed, want);
    }

    #[tokio::test]
    async fn a_stream_past_its_cap_fails_and_ends() {
        let chunks = (0..10).map(|_| Ok::<_, std::io::Error>(Bytes::from_static(b"0123456789")));
        let limited = limit(futures_util::stream::iter(chunks), 25);
        let got: Vec<_> = limited.collect().await;
        assert_eq!(got.len(), 3, "two chunks, then the error, then the end");
        assert!(got[0].is_ok() && got[1].is_ok());
        assert!(matches!(got[2], Err(LimitError::TooLarge(TooLarge(25)))));
    }
}
