//! Delta compaction: once an assistant message is complete, its `message_delta` events are
//! redundant in Redis (the `message_completed` event that follows holds the whole text), yet
//! each carries a ~170-byte envelope for a few bytes of text. At a realistic streaming rate the
//! deltas alone would hold 10–15 times the streamed text.
//!
//! So the worker rewrites a finished message's deltas in place: the first becomes a small
//! header (`"type":"~delta"`, each delta's text length and its time before the completion),
//! the others become empty strings. Positions, and therefore ids, are unchanged. The API
//! expands the range back into the very events that were appended (same ids, texts and
//! timestamps, byte for byte), sliced out of the `message_completed` content, so a replay
//! still equals what a live client saw. Live clients are unaffected: pub/sub carries each
//! event in full when it is appended.

use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use crate::config::CompactHeader;
use crate::events::{AppendError, EventBus, EventType, Unnumbered};

/// The type tag of a compacted range's first element.
pub const HEADER_TYPE: &str = "~delta";

/// One delta as the worker appended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRecord {
    pub id: u64,
    /// Text length in bytes.
    pub len: usize,
    /// The envelope's `at`, in Unix milliseconds.
    pub at_ms: i64,
}

/// A compacted range `id..=to`; the range's `message_completed` is `to + 1`. Stored as
/// [`StoredHeader`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "StoredHeader")]
pub struct Header {
    pub id: u64,
    #[serde(rename = "type")]
    pub kind: String,
    pub to: u64,
    /// Text length of each delta, in bytes.
    pub n: Vec<usize>,
    /// Milliseconds from each delta's `at` to the next event's (the last one's: to the
    /// completion's). Gaps, not offsets: a few digits each.
    pub ms: Vec<i64>,
}

/// A header as stored: `d` spells each delta's text length, then its gap less `b` (the
/// median gap: most gaps are close to `events.delta_flush_ms`), as variable-length numbers in
/// URL-safe base-64 characters (five bits each, the sixth set while more follow; gaps
/// zigzag-encoded): two or three bytes a delta where the decimal arrays took six, which was
/// almost half of the list's size beyond the text. Headers written before it hold the arrays
/// `n` and `ms` instead, and still parse.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredHeader {
    id: u64,
    #[serde(rename = "type")]
    kind: String,
    to: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    n: Option<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ms: Option<Vec<i64>>,
}

impl StoredHeader {
    fn of(h: &Header, form: CompactHeader) -> Self {
        let (b, d, n, ms) = match form {
            CompactHeader::Arrays => (None, None, Some(h.n.clone()), Some(h.ms.clone())),
            CompactHeader::Packed => {
                let mut sorted = h.ms.clone();
                sorted.sort_unstable();
                let base = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
                let mut d = String::with_capacity(3 * h.n.len());
                for (len, gap) in h.n.iter().zip(&h.ms) {
                    push_number(&mut d, *len as u64);
                    push_number(&mut d, zigzag(gap.saturating_sub(base)));
                }
                (Some(base), Some(d), None, None)
            }
        };
        StoredHeader {
            id: h.id,
            kind: h.kind.clone(),
            to: h.to,
            b,
            d,
            n,
            ms,
        }
    }
}

impl TryFrom<StoredHeader> for Header {
    type Error = String;

    fn try_from(s: StoredHeader) -> Result<Self, String> {
        let (n, ms) = match (s.d, s.n, s.ms) {
            (Some(d), _, _) => {
                let base = s.b.unwrap_or(0);
                let numbers = read_numbers(&d).ok_or("malformed `d`")?;
                if numbers.len() % 2 != 0 {
                    return Err("`d` holds an odd count of numbers".into());
                }
                let n = numbers
                    .iter()
                    .step_by(2)
                    .map(|&len| usize::try_from(len).map_err(|_| "a length out of range"))
                    .collect::<Result<Vec<_>, _>>()?;
                let ms = numbers
                    .iter()
                    .skip(1)
                    .step_by(2)
                    .map(|&gap| unzigzag(gap).saturating_add(base))
                    .collect();
                (n, ms)
            }
            (None, Some(n), Some(ms)) => (n, ms),
            _ => return Err("neither `d` nor `n` and `ms`".into()),
        };
        Ok(Header {
            id: s.id,
            kind: s.kind,
            to: s.to,
            n,
            ms,
        })
    }
}

const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
/// Set on a character when more of the same number follow.
const MORE: u8 = 32;

fn push_number(out: &mut String, mut v: u64) {
    loop {
        let low = (v & 31) as u8;
        v >>= 5;
        if v == 0 {
            out.push(DIGITS[low as usize] as char);
            return;
        }
        out.push(DIGITS[(low | MORE) as usize] as char);
    }
}

/// The numbers `push_number` wrote; `None` on a character outside the alphabet, a number
/// left unfinished or one beyond 64 bits.
fn read_numbers(d: &str) -> Option<Vec<u64>> {
    let mut numbers = Vec::with_capacity(d.len() / 2);
    let (mut value, mut shift) = (0u64, 0u32);
    for c in d.bytes() {
        let digit = DIGITS.iter().position(|&x| x == c)? as u64;
        if shift > 60 {
            return None;
        }
        value |= (digit & 31) << shift;
        if digit & u64::from(MORE) == 0 {
            numbers.push(value);
            (value, shift) = (0, 0);
        } else {
            shift += 5;
        }
    }
    (shift == 0).then_some(numbers)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

impl Header {
    /// The header for `deltas` (contiguous ids, ending right before the completion, spelling
    /// out its whole `content_len` bytes of text), or `None` when they cannot be compacted
    /// safely (a delta was lost to a Redis error, say).
    pub fn build(
        deltas: &[DeltaRecord],
        completed_id: u64,
        completed_at_ms: i64,
        content_len: usize,
    ) -> Option<Self> {
        let first = deltas.first()?;
        let contiguous = deltas.windows(2).all(|w| w[1].id == w[0].id + 1);
        let last = deltas.last()?;
        let spelled: usize = deltas.iter().map(|d| d.len).sum();
        if !contiguous || last.id + 1 != completed_id || spelled != content_len {
            return None;
        }
        Some(Header {
            id: first.id,
            kind: HEADER_TYPE.to_owned(),
            to: last.id,
            n: deltas.iter().map(|d| d.len).collect(),
            ms: deltas
                .iter()
                .zip(
                    deltas
                        .iter()
                        .skip(1)
                        .map(|d| d.at_ms)
                        .chain([completed_at_ms]),
                )
                .map(|(d, next)| next - d.at_ms)
                .collect(),
        })
    }

    /// The JSON stored in the list, in `form` (`events.compact_header`).
    pub fn stored(&self, form: CompactHeader) -> String {
        serde_json::to_string(&StoredHeader::of(self, form)).expect("a header serializes")
    }

    pub fn covers(&self, id: u64) -> bool {
        (self.id..=self.to).contains(&id)
    }

    /// The original event `id` of the range, rebuilt from the raw `message_completed` that
    /// follows it. `None` if the completion does not match (it should never happen: the
    /// worker compacts only what it appended itself).
    pub fn expand(&self, id: u64, completed_raw: &str) -> Option<String> {
        #[derive(Deserialize)]
        struct Completed {
            id: u64,
            run_id: Uuid,
            thread_id: Uuid,
            at: String,
            data: CompletedData,
        }
        #[derive(Deserialize)]
        struct CompletedData {
            content: Option<String>,
        }
        if !self.covers(id)
            || self.n.len() as u64 != self.to - self.id + 1
            || self.ms.len() != self.n.len()
        {
            return None;
        }
        let completed: Completed = serde_json::from_str(completed_raw).ok()?;
        if completed.id != self.to + 1 {
            return None;
        }
        let content = completed.data.content.unwrap_or_default();
        let index = (id - self.id) as usize;
        let offset: usize = self.n[..index].iter().sum();
        let text = content.get(offset..offset + self.n[index])?;
        let completed_at = chrono::DateTime::parse_from_rfc3339(&completed.at).ok()?;
        let before: i64 = self.ms.get(index..)?.iter().sum();
        let at = completed_at.timestamp_millis() - before;
        let at = chrono::DateTime::from_timestamp_millis(at)?;
        let data = json!({"text": text});
        let body = serde_json::to_string(&Unnumbered {
            run_id: completed.run_id,
            thread_id: completed.thread_id,
            kind: EventType::MessageDelta,
            at: crate::events::timestamp(at),
            data: &data,
        })
        .ok()?;
        Some(format!("{{\"id\":{id},{}", &body[1..]))
    }
}

/// Parses a stored element as a compaction header.
pub fn parse_header(raw: &str) -> Option<Header> {
    if !raw.contains(HEADER_TYPE) {
        return None;
    }
    serde_json::from_str::<Header>(raw)
        .ok()
        .filter(|h| h.kind == HEADER_TYPE)
}

/// KEYS: list, fence, base. ARGV: token, first id, last id, header JSON. Positions are
/// `id - base` (see `events::APPEND_LUA`).
/// Refuses a stale holder, and rewrites nothing unless the range still holds the events it
/// names: deltas at both ends and the completion right after (the list may have been lost and
/// refilled with `lost` placeholders meanwhile, which carry the same ids).
const COMPACT_LUA: &str = r#"
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < fence then return -1 end
local base = tonumber(redis.call('GET', KEYS[3]) or '0')
local first = tonumber(ARGV[2])
local last = tonumber(ARGV[3])
if first <= base then return 0 end
if redis.call('LLEN', KEYS[1]) < last + 1 - base then return 0 end
local expect = {{first, 'message_delta'}, {last, 'message_delta'}, {last + 1, 'message_completed'}}
for _, e in ipairs(expect) do
  local id, kind = e[1], e[2]
  local item = redis.call('LINDEX', KEYS[1], id - 1 - base)
  local head = '{"id":' .. id .. ',"run_id":'
  if string.sub(item, 1, string.len(head)) ~= head then return 0 end
  if not string.find(item, '"type":"' .. kind .. '"', 1, true) then return 0 end
end
redis.call('LSET', KEYS[1], first - 1 - base, ARGV[4])
for id = first + 1, last do
  redis.call('LSET', KEYS[1], id - 1 - base, '')
end
return 1
"#;

static SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(COMPACT_LUA));

impl EventBus {
    /// Rewrites a finished message's deltas as one header (see the module docs). Returns
    /// whether the range was rewritten.
    pub async fn compact_deltas(
        &self,
        run: Uuid,
        fence: i64,
        header: &Header,
    ) -> Result<bool, AppendError> {
        let raw = header.stored(self.compact_header());
        let keys = self.keys();
        let (events, fence_key, base) = (keys.events(run), keys.fence(run), keys.base(run));
        // Repeating it is harmless: a range already rewritten no longer holds its deltas.
        let done: i64 = self
            .call(|mut conn, _| {
                let mut invocation = SCRIPT.prepare_invoke();
                invocation
                    .key(&events)
                    .key(&fence_key)
                    .key(&base)
                    .arg(fence)
                    .arg(header.id)
                    .arg(header.to)
                    .arg(&raw);
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        if done < 0 {
            return Err(AppendError::Fenced {
                run_id: run,
                current: 0,
            });
        }
        Ok(done == 1)
    }
}

/// A `message_delta` that could not be rebuilt (its completion is gone): still delivered, so
/// ids stay gap-free, with no text and `superseded: true`.
pub fn superseded_delta(id: u64, run_id: Uuid, thread_id: Uuid) -> String {
    json!({"id": id, "run_id": run_id, "thread_id": thread_id, "type": "message_delta",
           "at": crate::events::timestamp(chrono::Utc::now()),
           "data": {"text": "", "superseded": true}})
    .to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn appended(id: u64, kind: EventType, at_ms: i64, data: Value) -> String {
        let at = chrono::DateTime::from_timestamp_millis(at_ms).unwrap();
        let body = serde_json::to_string(&Unnumbered {
            run_id: Uuid::nil(),
            thread_id: Uuid::max(),
            kind,
            at: crate::events::timestamp(at),
            data: &data,
        })
        .unwrap();
        format!("{{\"id\":{id},{}", &body[1..])
    }

    #[test]
    fn expansion_restores_every_delta_byte_for_byte() {
        let pieces = ["Hé", "llo, ", "wörld", "!"];
        let t0 = 1_795_000_000_000i64;
        let originals: Vec<String> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| {
                appended(
                    4 + i as u64,
                    EventType::MessageDelta,
                    t0 + 37 * i as i64,
                    json!({"text": p}),
                )
            })
            .collect();
        let records: Vec<DeltaRecord> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| DeltaRecord {
                id: 4 + i as u64,
                len: p.len(),
                at_ms: t0 + 37 * i as i64,
            })
            .collect();
        let done_at = t0 + 500;
        let completed = appended(
            8,
            EventType::MessageCompleted,
            done_at,
            json!({"content": pieces.concat(), "tool_calls": []}),
        );
        let header =
            Header::build(&records, 8, done_at, pieces.concat().len()).expect("compactable");
        let stored = header.stored(CompactHeader::Packed);
        let header = parse_header(&stored).expect("parses back");
        for (i, original) in originals.iter().enumerate() {
            assert_eq!(
                header.expand(4 + i as u64, &completed).as_deref(),
                Some(original.as_str())
            );
        }
        assert_eq!(header.expand(9, &completed), None, "outside the range");
    }

    #[test]
    fn only_a_contiguous_range_right_before_its_completion_is_compacted() {
        let d = |id| DeltaRecord {
            id,
            len: 1,
            at_ms: 0,
        };
        assert!(Header::build(&[d(3), d(4)], 5, 0, 2).is_some());
        assert!(Header::build(&[d(3), d(5)], 6, 0, 2).is_none(), "a hole");
        assert!(
            Header::build(&[d(3), d(4)], 6, 0, 2).is_none(),
            "not adjacent"
        );
        assert!(
            Header::build(&[d(3), d(4)], 5, 0, 3).is_none(),
            "text missing"
        );
        assert!(Header::build(&[], 6, 0, 0).is_none());
    }

    /// The stored form spells every length and gap back exactly, far from the median and
    /// negative ones included, in a fraction of the decimal arrays' bytes; a header stored
    /// as arrays (by a worker before it) still parses; a malformed one does not.
    #[test]
    fn a_header_is_stored_compactly_and_read_back_exactly() {
        // 234 deltas: what the benchmark's 3 KB answer streams at a 50 ms flush, with a few
        // lengths and gaps far from the rest (a long pause, a clock step back).
        let header_of = |lens: &[usize], gaps: &[i64]| {
            let mut at = 1_795_000_000_000i64;
            let records: Vec<DeltaRecord> = (0..234u64)
                .map(|i| {
                    at += gaps[i as usize % gaps.len()];
                    DeltaRecord {
                        id: 10 + i,
                        len: lens[i as usize % lens.len()],
                        at_ms: at,
                    }
                })
                .collect();
            let total: usize = records.iter().map(|r| r.len).sum();
            Header::build(&records, 244, at + 20, total).expect("compactable")
        };
        let arrays = |h: &Header| h.stored(CompactHeader::Arrays);
        let typical = header_of(&[13, 12, 14, 13, 11], &[48, 64, 50, 51, 49, 53, 47]);
        let stored = typical.stored(CompactHeader::Packed);
        assert_eq!(parse_header(&stored).as_ref(), Some(&typical), "{stored}");
        assert!(
            stored.len() * 2 < arrays(&typical).len(),
            "{} bytes against {} as arrays",
            stored.len(),
            arrays(&typical).len()
        );
        let odd = header_of(&[13, 0, 1, 40, 100_000], &[48, 0, 3000, -5, 86_400_000]);
        let stored = odd.stored(CompactHeader::Packed);
        assert_eq!(parse_header(&stored).as_ref(), Some(&odd), "{stored}");
        assert_eq!(
            parse_header(&arrays(&odd)).as_ref(),
            Some(&odd),
            "the old form"
        );
        for bad in [
            r#"{"id":1,"type":"~delta","to":1,"b":0,"d":"g"}"#,
            r#"{"id":1,"type":"~delta","to":1,"b":0,"d":"A*"}"#,
            r#"{"id":1,"type":"~delta","to":1,"b":0,"d":"A"}"#,
            r#"{"id":1,"type":"~delta","to":1,"b":0,"d":"gggggggggggggggA"}"#,
            r#"{"id":1,"type":"~delta","to":1}"#,
        ] {
            assert_eq!(parse_header(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_mismatched_completion_expands_to_nothing() {
        let header = Header::build(
            &[DeltaRecord {
                id: 2,
                len: 50,
                at_ms: 0,
            }],
            3,
            0,
            50,
        )
        .unwrap();
        let completed = appended(
            3,
            EventType::MessageCompleted,
            0,
            json!({"content": "short"}),
        );
        assert_eq!(header.expand(2, &completed), None);
        assert!(parse_header(r#"{"id":1,"type":"run_started"}"#).is_none());
    }
}
