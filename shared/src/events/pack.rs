//! Packing a finished run's list: its events but the last, deflated into the list's first element.
//!
//! A finished run's list is kept for `events.retention_secs` only to be replayed, and most of it
//! is envelope: a short run streams a kilobyte of text in lists of five (its ids, types and times
//! repeated in every event; the run's and thread's ids alone are a third of each small one).
//! Deflated, the same events take about a quarter.
//!
//! The list keeps its length, so ids (`base + position`), `LLEN` and every script that reasons on
//! positions are unchanged: the first element becomes the pack, the others it holds become empty
//! strings, and the last (the terminal event, which `append_terminal_once` looks at) stays as it
//! is. Readers ([`super::EventBus::read_range`]) put the packed events back in their places, so a
//! replay is byte for byte what was appended. An event appended after the pack (a late writer)
//! lands after it as usual.

use super::AppendError;
use super::EventBus;
use uuid::Uuid;

/// How a packed first element begins: `~z:{unpacked bytes}:` then the deflated events, joined by
/// `\n` (stored events are JSON, which never holds a raw newline).
const MARK: &[u8] = b"~z:";

/// A pack's events unpacked are at most this many bytes (a guard on a corrupt length).
const MAX_UNPACKED: usize = 256 << 20;

/// Deflate level: 6 is within a few per cent of the best on these small JSON lists at a third of
/// its time.
const LEVEL: u8 = 6;

/// Whether `element` is a pack.
pub(crate) fn is_pack(element: &[u8]) -> bool {
    element.starts_with(MARK)
}

/// The pack of `events` (positions 0.. of a list); `None` when it would not be smaller, or an
/// event cannot be packed (it holds a newline or is itself a pack).
pub fn pack(events: &[Vec<u8>]) -> Option<Vec<u8>> {
    if events.iter().any(|e| is_pack(e) || e.contains(&b'\n')) {
        return None;
    }
    let joined = events.join(&b'\n');
    let deflated = deflate(&joined);
    let mut out = Vec::with_capacity(MARK.len() + 12 + deflated.len());
    out.extend_from_slice(MARK);
    out.extend_from_slice(joined.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(&deflated);
    (out.len() < joined.len()).then_some(out)
}

/// Deflates `input` with this thread's compressor: its state (a window and hash tables, about
/// 300 KiB) is reset for each pack instead of allocated and zeroed, which was most of a pack's
/// CPU for the lists of short runs.
fn deflate(input: &[u8]) -> Vec<u8> {
    use miniz_oxide::deflate::core::{
        CompressorOxide, TDEFLFlush, TDEFLStatus, compress, create_comp_flags_from_zip_params,
    };
    thread_local! {
        static COMPRESSOR: std::cell::RefCell<Option<Box<CompressorOxide>>> =
            const { std::cell::RefCell::new(None) };
    }
    COMPRESSOR.with_borrow_mut(|slot| {
        let compressor = slot.get_or_insert_with(|| {
            let flags = create_comp_flags_from_zip_params(LEVEL.into(), 0, 0);
            Box::new(CompressorOxide::new(flags))
        });
        compressor.reset();
        let mut output = vec![0; (input.len() / 2).max(64)];
        let (mut input, mut at) = (input, 0);
        loop {
            let (status, read, written) =
                compress(compressor, input, &mut output[at..], TDEFLFlush::Finish);
            at += written;
            match status {
                TDEFLStatus::Done => {
                    output.truncate(at);
                    return output;
                }
                TDEFLStatus::Okay => {
                    input = &input[read..];
                    if output.len() - at < 64 {
                        output.resize(output.len() * 2, 0);
                    }
                }
                // Only for a bad parameter or a state misused: none here.
                other => panic!("deflate failed: {other:?}"),
            }
        }
    })
}

/// The events of a pack, in their positions from 0; `None` if it does not unpack.
pub fn unpack(element: &[u8]) -> Option<Vec<String>> {
    let rest = element.strip_prefix(MARK)?;
    let colon = rest.iter().position(|b| *b == b':')?;
    let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
    if len > MAX_UNPACKED {
        return None;
    }
    let joined =
        miniz_oxide::inflate::decompress_to_vec_with_limit(&rest[colon + 1..], len).ok()?;
    let joined = String::from_utf8(joined).ok()?;
    Some(joined.split('\n').map(str::to_owned).collect())
}

/// KEYS: list, fence. ARGV: token, the list's length when read, the pack, its last element when
/// read. Rewrites the list as the pack, empty strings, and the last element, keeping its expiry,
/// only if the holder's fence still holds and the list still ends where it was read (nothing
/// appended since). Returns 1 when packed, 0 when left alone, -1 when fenced off.
const PACK_LUA: &str = r#"
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < fence then return -1 end
local n = tonumber(ARGV[2])
if redis.call('LLEN', KEYS[1]) ~= n then return 0 end
if redis.call('LINDEX', KEYS[1], -1) ~= ARGV[4] then return 0 end
local head = redis.call('LINDEX', KEYS[1], 0)
if string.sub(head, 1, 3) == '~z:' then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('RPUSH', KEYS[1], ARGV[3])
local left = n - 2
local empties = {}
for i = 1, math.min(left, 1000) do empties[i] = '' end
while left > 0 do
  local k = math.min(left, 1000)
  redis.call('RPUSH', KEYS[1], unpack(empties, 1, k))
  left = left - k
end
redis.call('RPUSH', KEYS[1], ARGV[4])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"#;

static SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(PACK_LUA));

/// What [`EventBus::pack_finished`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    /// The list was rewritten: this many bytes of events became a pack of `into`.
    Packed { from: usize, into: usize },
    /// Left as it is: too short, too long, already packed, not ended by a terminal event, not
    /// smaller packed, or changed while it was read.
    Left,
}

impl EventBus {
    /// Packs a finished run's list (see the module's note), by the holder that ended it: at most
    /// `events.pack_max_events` events, read and rewritten in two round trips. Only bytes depend
    /// on it: a list left unpacked is served the same.
    pub async fn pack_finished(&self, run: Uuid, fence: i64) -> Result<Packed, AppendError> {
        let max = self.pack_max_events();
        if max == 0 {
            return Ok(Packed::Left);
        }
        let (list, fence_key) = (self.keys().events(run), self.keys().fence(run));
        // One past the bound: a list longer than it comes back one too long, unread beyond.
        let mut read = redis::cmd("LRANGE");
        read.arg(&list).arg(0).arg(max);
        let events: Vec<Vec<u8>> = self
            .call(|mut conn, _| {
                let read = &read;
                async move { read.query_async(&mut conn).await }
            })
            .await?;
        let n = events.len();
        if n < 3 || n as u64 > max {
            return Ok(Packed::Left);
        }
        let last = &events[n - 1];
        let terminal = ["run_completed", "run_failed", "run_cancelled"]
            .iter()
            .any(|t| contains(last, format!("\"type\":\"{t}\"").as_bytes()));
        if !terminal {
            return Ok(Packed::Left);
        }
        let from: usize = events[..n - 1].iter().map(Vec::len).sum();
        let Some(blob) = pack(&events[..n - 1]) else {
            return Ok(Packed::Left);
        };
        let into = blob.len();
        let done: i64 = self
            .call(|mut conn, _| {
                let mut invocation = SCRIPT.prepare_invoke();
                invocation
                    .key(&list)
                    .key(&fence_key)
                    .arg(fence)
                    .arg(n)
                    .arg(&blob[..])
                    .arg(&last[..]);
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        match done {
            1 => Ok(Packed::Packed { from, into }),
            -1 => Err(AppendError::Fenced {
                run_id: run,
                current: 0,
            }),
            _ => Ok(Packed::Left),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_unpacks_to_the_same_events_in_their_places() {
        let events: Vec<Vec<u8>> = [
            r#"{"id":1,"run_id":"0196","type":"run_queued","at":"2026-11-28T23:00:00.000Z","data":{}}"#,
            r#"{"id":2,"type":"~delta","to":4,"d":"aab"}"#,
            "",
            "",
            r#"{"id":5,"run_id":"0196","type":"message_completed","data":{"content":"héllo \" \\n"}}"#,
            r#"{"id":6,"run_id":"0196","type":"run_queued","at":"2026-11-28T23:00:00.000Z","data":{}}"#,
        ]
        .iter()
        .map(|e| e.as_bytes().to_vec())
        .collect();
        let blob = pack(&events).expect("smaller packed");
        assert!(is_pack(&blob));
        let back = unpack(&blob).expect("unpacks");
        let back: Vec<Vec<u8>> = back.into_iter().map(String::into_bytes).collect();
        assert_eq!(back, events);
    }

    #[test]
    fn one_compressor_packs_one_list_after_another() {
        let long: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!(r#"{{"id":{i},"type":"message_delta","data":{{"text":"t{i}"}}}}"#))
            .map(String::into_bytes)
            .collect();
        let short = vec![
            b"{\"id\":1,\"type\":\"run_queued\"}".repeat(3),
            b"{}".to_vec(),
        ];
        for events in [&long, &short, &long] {
            let blob = pack(events).expect("smaller packed");
            let back: Vec<Vec<u8>> = unpack(&blob)
                .expect("unpacks")
                .into_iter()
                .map(String::into_bytes)
                .collect();
            assert_eq!(&back, events);
        }
    }

    #[test]
    fn what_cannot_be_packed_is_left() {
        let newline = vec![b"{\"a\":1}\n".to_vec(), b"{}".to_vec()];
        assert_eq!(pack(&newline), None, "a newline would split an event");
        let nested = vec![b"~z:3:abc".to_vec(), b"{}".to_vec()];
        assert_eq!(pack(&nested), None, "a pack is not packed again");
        let tiny = vec![b"{}".to_vec(), b"{}".to_vec()];
        assert_eq!(pack(&tiny), None, "not smaller");
    }

    #[test]
    fn a_corrupt_pack_does_not_unpack() {
        assert_eq!(unpack(b"~z:10:not deflate"), None);
        assert_eq!(unpack(b"~z:x:"), None);
        assert_eq!(unpack(b"{\"id\":1}"), None);
        let events = vec![b"{\"id\":1,\"type\":\"x\"}".repeat(20)];
        let mut blob = pack(&events).unwrap();
        // A length smaller than the events: the limit stops the inflation.
        let colon = 3 + blob[3..].iter().position(|b| *b == b':').unwrap();
        blob.splice(3..colon, b"5".iter().copied());
        assert_eq!(unpack(&blob), None);
    }
}
