use redis::AsyncCommands;
use serde_json::json;

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::*;

#[test]
fn run_cancelled_says_where_from_and_why_when_it_is_known() {
    use crate::domain::RunStatus;
    assert_eq!(
        cancelled_data(Some(RunStatus::WaitingForInput), None),
        json!({"previous_status": "waiting_for_input"})
    );
    assert_eq!(
        cancelled_data(
            Some(RunStatus::Running),
            Some(&json!({"code": "interrupted", "message": "m", "other": 1}))
        ),
        json!({"previous_status": "running", "code": "interrupted", "message": "m"})
    );
    // A run cancelled before the status was recorded, with no error.
    assert_eq!(cancelled_data(None, None), json!({}));
    assert_eq!(cancelled_data(None, Some(&Value::Null)), json!({}));
}

#[test]
fn run_keys_are_named_as_documented_and_read_back() {
    let keys = Keys::new("af_x");
    let run = Uuid::parse_str("0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B").unwrap();
    let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    assert_eq!(keys.events(run), format!("af_x:run:{{{id}}}:events"));
    assert_eq!(keys.live(run), format!("af_x:run:{{{id}}}:live"));
    assert_eq!(keys.control(run), format!("af_x:run:{{{id}}}:control"));
    assert_eq!(keys.fence(run), format!("af_x:run:{{{id}}}:fence"));
    assert_eq!(keys.base(run), format!("af_x:run:{{{id}}}:base"));
    assert_eq!(keys.thread_live(run), format!("af_x:thread:{{{id}}}:live"));
    assert_eq!(keys.id_of_channel(&keys.live(run)), Some(run));
    assert_eq!(keys.id_of_channel(&keys.control(run)), Some(run));
    assert_eq!(keys.id_of_channel(&keys.thread_live(run)), Some(run));
    assert!(keys.is_thread_channel(&keys.thread_live(run)));
    assert!(!keys.is_thread_channel(&keys.live(run)));
}

/// A Redis Cluster places a key by the part between its first `{` and the next `}`: every key
/// of a run must hash to the run's slot, whatever the prefix.
#[test]
fn every_key_of_a_run_shares_its_hash_tag() {
    fn tag(key: &str) -> &str {
        let open = key.find('{').expect("a hash tag");
        let close = open + key[open..].find('}').expect("a closed hash tag");
        &key[open + 1..close]
    }
    let keys = Keys::new("af.x-1");
    let run = Uuid::new_v4();
    let id = run.to_string();
    for key in [
        keys.events(run),
        keys.live(run),
        keys.control(run),
        keys.fence(run),
        keys.base(run),
    ] {
        assert_eq!(tag(&key), id, "{key}");
    }
    assert!(
        keys.control_pattern().chars().all(|c| c != '{'),
        "the prefix of a key names no hash tag of its own"
    );
}

#[test]
fn a_budget_pause_is_announced_as_input_required_with_its_figures() {
    let pending = serde_json::json!({"kind": "budget", "budget": "tenant", "used": 160,
            "limit": 100, "question": "raise it"});
    let (kind, data) = pending_event(&pending);
    assert_eq!(kind, EventType::InputRequired);
    assert_eq!(data["kind"], "budget");
    assert!(data["tool_call_id"].is_null());
    assert_eq!(
        (&data["used"], &data["limit"]),
        (&pending["used"], &pending["limit"])
    );
    assert_eq!(data["question"], "raise it");
    let ask = serde_json::json!({"kind": "input", "tool_call_id": "c1", "question": "q"});
    let (kind, data) = pending_event(&ask);
    assert_eq!(kind, EventType::InputRequired);
    assert!(
        data.get("kind").is_none(),
        "an ask's event is unchanged: {data}"
    );
}

#[test]
fn keys_follow_the_design_names() {
    let k = Keys::new("agentfleet");
    let id = Uuid::nil();
    assert_eq!(k.events(id), format!("agentfleet:run:{{{id}}}:events"));
    assert_eq!(k.live(id), format!("agentfleet:run:{{{id}}}:live"));
    assert_eq!(k.control(id), format!("agentfleet:run:{{{id}}}:control"));
    assert_eq!(k.id_of_channel(&k.live(id)), Some(id));
    assert_eq!(k.id_of_channel("other:run:{x}:live"), None);
    assert_eq!(k.id_of_channel("agentfleet:run:x:live"), None);
}

fn bus_at(url: String, timeout_ms: u64) -> EventBus {
    let settings = crate::config::Settings::load_with(
        None,
        [
            ("redis.url".to_owned(), url),
            ("redis.timeout_ms".to_owned(), timeout_ms.to_string()),
        ],
        false,
    )
    .unwrap();
    let conn = redis_connection(&settings.redis).unwrap();
    EventBus::new(conn, "t", 60).with_timeout(settings.redis.timeout())
}

async fn append_one(bus: &EventBus) -> Result<Appended, AppendError> {
    let data = serde_json::json!({});
    let event = NewEvent {
        run_id: Uuid::new_v4(),
        thread_id: Uuid::new_v4(),
        kind: EventType::RunStarted,
        data: &data,
    };
    bus.append(event, 2, Floor::Exact(0), Expiry::Keep).await
}

/// A holder's events sent as one pipeline get consecutive ids in order, each with its
/// expiry, also right after Redis lost its script cache (the pipeline is sent without
/// the script first, then again from the first invocation that found none).
#[tokio::test]
async fn events_of_one_run_appended_together_keep_their_order_after_a_script_flush() {
    let bus = bus_at("redis://127.0.0.1:6379".to_owned(), 2_000);
    let mut conn = bus.conn.clone();
    let (run_id, thread_id) = (Uuid::new_v4(), Uuid::new_v4());
    let data = [json!({"n": 1}), json!({"n": 2}), json!({"n": 3})];
    let kinds = [
        EventType::RunStarted,
        EventType::IterationStarted,
        EventType::RunCompleted,
    ];
    let expiries = [Expiry::Persist, Expiry::Keep, Expiry::Expire];
    let events: Vec<(NewEvent<'_>, Expiry)> = (0..3)
        .map(|i| {
            let event = NewEvent {
                run_id,
                thread_id,
                kind: kinds[i],
                data: &data[i],
            };
            (event, expiries[i])
        })
        .collect();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let outcomes = bus
        .append_run(&events[..2], 2, Floor::Exact(0))
        .await
        .unwrap();
    let ids: Vec<u64> = outcomes.into_iter().map(|o| o.unwrap().id).collect();
    assert_eq!(ids, [1, 2]);
    let ttl: i64 = conn.ttl(bus.keys().events(run_id)).await.unwrap();
    assert_eq!(ttl, -1, "kept: no expiry before the end");
    let outcomes = bus
        .append_run(&events[2..], 2, Floor::Exact(2))
        .await
        .unwrap();
    assert_eq!(outcomes[0].as_ref().unwrap().id, 3);
    let ttl: i64 = conn.ttl(bus.keys().events(run_id)).await.unwrap();
    assert!(ttl > 0 && ttl <= 60, "the end sets the retention: {ttl}");
    let listed = bus.read_after(run_id, 0).await.unwrap();
    let seen: Vec<(u64, String)> = listed.iter().filter_map(|raw| peek(raw)).collect();
    assert_eq!(
        seen,
        [
            (1, "run_started".to_owned()),
            (2, "iteration_started".to_owned()),
            (3, "run_completed".to_owned())
        ]
    );
    let fenced = bus
        .append_run(&events[1..2], 1, Floor::Exact(3))
        .await
        .unwrap();
    assert!(
        matches!(fenced[0], Err(AppendError::Fenced { .. })),
        "an older fence is refused"
    );
    let _: () = conn
        .del(&[
            bus.keys().events(run_id),
            bus.keys().fence(run_id),
            bus.keys().base(run_id),
        ])
        .await
        .unwrap();
}

/// Appends are best-effort: with nobody listening, an append fails (as unavailable), and
/// soon, however the reconnect policy goes.
#[tokio::test]
async fn an_append_to_a_closed_port_fails_within_the_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let bus = bus_at(format!("redis://127.0.0.1:{port}"), 400);
    for _ in 0..3 {
        let began = std::time::Instant::now();
        let err = append_one(&bus).await.unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        assert!(
            began.elapsed() < Duration::from_millis(900),
            "{:?}",
            began.elapsed()
        );
    }
}

/// A server that accepts and never answers (a stalled Redis) holds an append for at most
/// `redis.timeout_ms`.
#[tokio::test]
async fn an_append_to_a_silent_server_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let bus = bus_at(format!("redis://127.0.0.1:{port}"), 300);
    let began = std::time::Instant::now();
    let err = append_one(&bus).await.unwrap_err();
    assert!(matches!(err, AppendError::Timeout(_)), "{err}");
    assert!(err.is_unavailable());
    assert!(
        began.elapsed() < Duration::from_millis(800),
        "{:?}",
        began.elapsed()
    );
    held.abort();
}

#[test]
fn peek_reads_id_and_type() {
    assert_eq!(
        peek(r#"{"id":3,"type":"run_started","data":{}}"#),
        Some((3, "run_started".into()))
    );
}

/// A finished list packs in place: same length and expiry, read back (whole, in ranges, inside
/// the pack and past it) exactly as appended; a stale holder cannot pack, a list that does not
/// end with a terminal event or is past the bound is left alone, and what comes after the pack
/// (a declined repeat of the end, a late writer's append) behaves as on an unpacked list.
#[tokio::test]
async fn a_finished_list_packs_in_place_and_reads_back_as_appended() {
    let bus = bus_at("redis://127.0.0.1:6379".to_owned(), 2_000).with_pack_max_events(100);
    let mut conn = bus.conn.clone();
    let (run_id, thread_id) = (Uuid::new_v4(), Uuid::new_v4());
    let mut data: Vec<(EventType, Value)> = vec![
        (EventType::RunStarted, json!({"worker": "w"})),
        (EventType::IterationStarted, json!({"iteration": 1})),
    ];
    for n in 0..25 {
        data.push((EventType::MessageDelta, json!({"text": format!("tok{n} ")})));
    }
    data.push((EventType::MessageCompleted, json!({"content": "…"})));
    let events: Vec<(NewEvent<'_>, Expiry)> = data
        .iter()
        .map(|(kind, data)| {
            let event = NewEvent {
                run_id,
                thread_id,
                kind: *kind,
                data,
            };
            (event, Expiry::Keep)
        })
        .collect();
    bus.append_run(&events, 2, Floor::Exact(0)).await.unwrap();
    assert_eq!(
        bus.pack_finished(run_id, 2).await.unwrap(),
        Packed::Left,
        "not ended: left alone"
    );
    let end = json!({"iteration": 1});
    let completed = NewEvent {
        run_id,
        thread_id,
        kind: EventType::RunCompleted,
        data: &end,
    };
    bus.append(completed, 2, Floor::Exact(28), Expiry::Expire)
        .await
        .unwrap();
    let before = bus.read_after(run_id, 0).await.unwrap();
    assert_eq!(before.len(), 29);

    assert!(
        matches!(
            bus.pack_finished(run_id, 0).await,
            Err(AppendError::Fenced { .. })
        ),
        "a stale holder does not pack"
    );
    let small = bus.clone().with_pack_max_events(28);
    assert_eq!(
        small.pack_finished(run_id, 2).await.unwrap(),
        Packed::Left,
        "longer than the bound"
    );
    let Packed::Packed { from, into } = bus.pack_finished(run_id, 2).await.unwrap() else {
        panic!("packed")
    };
    assert!(into * 2 < from, "{from} bytes packed into {into}");
    let list = bus.keys().events(run_id);
    let len: usize = conn.llen(&list).await.unwrap();
    assert_eq!(len, 29, "every position kept");
    let ttl: i64 = conn.ttl(&list).await.unwrap();
    assert!(ttl > 0 && ttl <= 60, "the expiry kept: {ttl}");
    let raw: Vec<Vec<u8>> = conn.lrange(&list, 0, -1).await.unwrap();
    assert!(raw[0].starts_with(b"~z:"));
    assert!(raw[1..28].iter().all(Vec::is_empty));
    assert_eq!(bus.pack_finished(run_id, 2).await.unwrap(), Packed::Left);

    assert_eq!(bus.read_after(run_id, 0).await.unwrap(), before);
    for (from, to) in [(1, 1), (5, 9), (27, 29), (29, 29)] {
        assert_eq!(
            bus.read_range(run_id, from, to).await.unwrap(),
            before[from as usize - 1..to as usize],
            "{from}..={to}"
        );
    }
    assert_eq!(bus.read_after(run_id, 28).await.unwrap(), before[28..]);
    assert_eq!(bus.len(run_id).await.unwrap(), 29);

    let again = bus
        .append_terminal_once(completed, crate::events::FINAL_FENCE, Floor::Recorded(29))
        .await
        .unwrap();
    assert!(again.is_none(), "the end is not repeated");
    let late = json!({});
    let late = NewEvent {
        run_id,
        thread_id,
        kind: EventType::RunCancelled,
        data: &late,
    };
    let appended = bus
        .append(
            late,
            crate::events::FINAL_FENCE,
            Floor::Exact(29),
            Expiry::Expire,
        )
        .await
        .unwrap();
    assert_eq!(appended.id, 30, "a late append lands after the pack");
    let after = bus.read_after(run_id, 0).await.unwrap();
    assert_eq!(after[..29], before[..]);
    assert_eq!(peek(&after[29]), Some((30, "run_cancelled".to_owned())));

    let _: () = conn
        .del(&[list, bus.keys().fence(run_id), bus.keys().base(run_id)])
        .await
        .unwrap();
}
