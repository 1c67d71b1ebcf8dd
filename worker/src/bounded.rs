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
