use super::*;

fn plan(turns: usize, tool_calls: usize) -> Plan {
    Plan {
        in_flight: 10,
        duration: Duration::from_secs(1),
        offered_rate: None,
        first_byte_ms: 800,
        turns,
        tokens: 80,
        chunk_gap_ms: 25,
        tool_calls,
        tool_ms: 300,
        question_share: 0.1,
        confirm_share: 0.05,
        answer_after: Duration::from_secs(2),
        cut_share: 0.1,
        workers: 1,
        slots: 16,
        sample_every: Duration::from_secs(1),
    }
}

#[test]
fn tool_calls_are_dealt_round_the_calls_before_the_last() {
    let p = plan(3, 2);
    assert_eq!((p.calls_in(0), p.calls_in(1), p.calls_in(2)), (1, 1, 0));
    assert_eq!(p.pausing_turn(), 1);
    let p = plan(4, 5);
    assert_eq!(
        (0..4).map(|t| p.calls_in(t)).collect::<Vec<_>>(),
        [2, 2, 1, 0]
    );
    let p = plan(3, 1);
    assert_eq!(p.pausing_turn(), 0, "the last call with tool calls");
    let p = plan(2, 0);
    assert_eq!(p.pausing_turn(), 0);
}

#[test]
fn scripts_pause_where_their_kind_says() {
    let p = plan(3, 2);
    let plain = p.script(Kind::Plain);
    let question = p.script(Kind::Question);
    let confirm = p.script(Kind::Confirm);
    assert_eq!(plain.as_array().unwrap().len(), 3);
    assert_eq!(
        plain[1]["tool_calls"],
        json!([{"name": "slow", "arguments": {"ms": 300}}])
    );
    assert_eq!(question[1]["tool_calls"][1]["name"], "ask");
    assert_eq!(confirm[1]["tool_calls"][0]["name"], "slow_confirmed");
    assert_eq!(confirm[0]["tool_calls"][0]["name"], "slow");
    assert_eq!(plain[2]["tool_calls"], json!([]));
    assert_eq!(plain[0]["content"].as_str().unwrap().len(), 4 * 80);
}

#[test]
fn the_scripted_duration_counts_every_wait() {
    let p = plan(3, 2);
    // Per call: 800 ms, then 25 ms before each frame but the first: role, 80 pieces, the
    // finish and the usage, and per tool call its head and three argument pieces.
    let tool_turn = 800.0 + 25.0 * (1.0 + 80.0 + 4.0 + 2.0 - 1.0) + 300.0;
    let last = 800.0 + 25.0 * (1.0 + 80.0 + 2.0 - 1.0);
    let plain = p.scripted_secs(Kind::Plain);
    assert!(
        (plain - (2.0 * tool_turn + last) / 1000.0).abs() < 1e-9,
        "{plain}"
    );
    let confirm = p.scripted_secs(Kind::Confirm);
    assert!((confirm - plain - 2.0).abs() < 1e-9);
    let question = p.scripted_secs(Kind::Question);
    assert!(
        (question - plain - 2.0 - 0.1).abs() < 1e-9,
        "the ask streams too"
    );
    assert!(p.longest_scripted_secs() >= question);
}

#[test]
fn percentiles_of_a_histogram_count_only_the_window() {
    let h = Histogram::new();
    h.record(500);
    let before = h.snapshot();
    for ms in [10, 20, 30, 40, 200_000] {
        h.record(ms);
    }
    let after = h.snapshot();
    assert_eq!(histogram_percentile(&before, &after, 0.5), 30.0);
    assert_eq!(histogram_percentile(&before, &after, 0.0), 10.0);
    assert_eq!(
        histogram_percentile(&before, &after, 1.0),
        Histogram::MAX_MS as f64
    );
    assert!(histogram_percentile(&after, &after, 0.5).is_nan());
}

#[test]
fn established_connections_are_counted_on_the_local_port() {
    let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:1F90 0100007F:C351 06 00000000:00000000 00:00000000 00000000     0        0 4 1";
    assert_eq!(established_on(text, 8080), 1);
    assert_eq!(established_on(text, 50000), 1);
    assert_eq!(established_on(text, 1), 0);
}

#[test]
fn the_mix_of_kinds_and_cuts_follows_the_shares() {
    let n = 20_000;
    let questions = (0..n).filter(|i| unit(*i, 1) < 0.1).count();
    let cuts = (0..n).filter(|i| unit(*i, 2) < 0.1).count();
    assert!((1800..2200).contains(&questions), "{questions}");
    assert!((1800..2200).contains(&cuts), "{cuts}");
}
