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
    #[error(transparent)]
    Inner(E),
}

#[cfg(test)]
mod tests {
    use super::*;

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
