//! The soak's schedule and verdicts, without processes: schedules from seeds, and each check
//! fed synthetic records and events, passing when the run was good and failing on its fault.

use std::collections::{BTreeMap, BTreeSet};

use neuroshard_node::events::NodeEvent;

use crate::chaos::{Action, Chaos, plan};
use crate::flood::{FloodStats, tcp_target};
use crate::probe::parse_hwm;
use crate::soak::{FinalLedger, FloodRecord, KillRecord, Soak, judge_ledgers};

fn step(stage: usize, time_ms: u64) -> NodeEvent {
    NodeEvent::Step {
        stage,
        step: 1,
        loss: None,
        tokens: 0,
        lr: 1e-3,
        grad_norm: 1.0,
        model_hash: String::new(),
        busy_ms: None,
        time_ms,
    }
}

fn stats(proofs: usize) -> NodeEvent {
    NodeEvent::Stats {
        stage: 0,
        step: 1,
        queue: 0,
        peers: 1,
        replicas: vec![1],
        net: None,
        sync_round: 0,
        theta: String::new(),
        ledger: neuroshard_node::events::LedgerSummary {
            state_hash: "h".into(),
            proofs,
            balance: 0,
            stake: 0,
            pending: 0,
        },
        time_ms: 9,
    }
}

#[test]
fn chaos_specs_read_over_the_defaults() {
    let c = Chaos::parse("secs=150,kill=20-30,partition-s=0,flood=off,seed=9").unwrap();
    assert_eq!((c.secs, c.kill_every, c.partition_s), (150, (20, 30), 0));
    assert!(!c.flood);
    assert_eq!(c.seed, 9);
    assert_eq!(c.restart_ms, Chaos::default().restart_ms);
    let c = Chaos::parse("mem-mb=900,recover-ms=5000,loss-drop=0.5").unwrap();
    assert_eq!((c.bounds.mem_mb, c.bounds.recover_ms), (900, 5_000));
    assert_eq!(c.bounds.loss_drop, 0.5);
    for bad in [
        "secs=0",
        "kill=30",
        "kill=60-30",
        "kill=0-5",
        "flood=maybe",
        "nope=1",
        "secs",
        "loss-drop=nan",
    ] {
        assert!(Chaos::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_seed_gives_one_schedule_and_another_seed_another() {
    let c = Chaos::default();
    assert_eq!(plan(&c, 6).unwrap(), plan(&c, 6).unwrap());
    let other = Chaos {
        seed: 2,
        ..c.clone()
    };
    assert_ne!(plan(&c, 6).unwrap(), plan(&other, 6).unwrap());
}

#[test]
fn schedules_keep_their_promises_over_many_seeds() {
    for seed in 0..300 {
        let c = Chaos {
            seed,
            ..Chaos::default()
        };
        let p = plan(&c, 6).unwrap();
        let window = c.secs * 1_000;
        assert!(p.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "sorted");
        let flooded = p.iter().find_map(|x| match x.action {
            Action::FloodStart(n) => Some(n),
            _ => None,
        });
        let flooded = flooded.expect("a flood");
        let cut = p.iter().find_map(|x| match x.action {
            Action::Cut(n) => Some((n, x.at_ms)),
            _ => None,
        });
        let (cut_node, cut_at) = cut.expect("a partition");
        let heal = p.iter().find_map(|x| match x.action {
            Action::Heal(n) => Some((n, x.at_ms)),
            _ => None,
        });
        assert_eq!(heal, Some((cut_node, cut_at + 20_000)));
        assert!((window / 3..=window / 2).contains(&cut_at), "{cut_at}");
        assert_ne!(flooded, 0);
        assert_ne!(cut_node, 0);
        assert_ne!(cut_node, flooded);
        let kills: Vec<(u64, usize)> = p
            .iter()
            .filter_map(|x| match x.action {
                Action::Kill(n) => Some((x.at_ms, n)),
                _ => None,
            })
            .collect();
        // 600 s at one kill every 30–60 s, less the slots the partition blocks.
        assert!((8..=20).contains(&kills.len()), "{}", kills.len());
        for w in kills.windows(2) {
            let gap = w[1].0 - w[0].0;
            // A slot skipped around the partition doubles a gap at most.
            assert!((30_000..=120_000).contains(&gap), "gap {gap}");
        }
        for (at, node) in kills {
            assert!(node != 0 && node != flooded && node < 6, "node {node}");
            assert!(at + c.restart_ms < window, "restart inside the window");
            // Not from 15 s before its cut (restart included) to the recovery target after.
            let near_cut =
                at + c.restart_ms + 15_000 >= cut_at && at <= cut_at + 20_000 + c.bounds.recover_ms;
            assert!(!(near_cut && node == cut_node), "killed the cut node");
        }
    }
}

#[test]
fn too_few_nodes_for_the_chaos_are_refused() {
    assert!(plan(&Chaos::default(), 2).is_err());
    let no_flood = Chaos {
        flood: false,
        ..Chaos::default()
    };
    assert!(plan(&no_flood, 2).is_ok());
    assert!(plan(&no_flood, 1).is_err());
}

fn ledger(hash: &str, proofs: &[u8]) -> FinalLedger {
    FinalLedger {
        state_hash: hash.into(),
        proofs: proofs.iter().map(|b| [*b; 32]).collect::<BTreeSet<_>>(),
        error: None,
    }
}

#[test]
fn an_accepted_entry_missing_from_a_final_ledger_is_found() {
    let accepted: BTreeMap<[u8; 32], (usize, u64)> =
        [1u8, 2, 3].iter().map(|b| ([*b; 32], (0, 0))).collect();
    let mut finals = BTreeMap::from([(0, ledger("h", &[1, 2, 3])), (1, ledger("h", &[1, 2, 3]))]);
    let v = judge_ledgers(&accepted, &finals);
    assert!(v.lost.is_empty() && v.missing.values().all(|m| *m == 0));
    assert!(v.state_hashes_equal);
    // Node 1 lacks entry 3: missing there, not lost (node 0 has it).
    finals.insert(1, ledger("h", &[1, 2]));
    let v = judge_ledgers(&accepted, &finals);
    assert_eq!(v.missing[&1], 1);
    assert!(v.lost.is_empty());
    // No final ledger holds 3: lost.
    finals.insert(0, ledger("h", &[1, 2]));
    let v = judge_ledgers(&accepted, &finals);
    assert_eq!(v.lost, vec![[3u8; 32]]);
    // An entry only one final ledger holds makes the others miss it.
    finals.insert(0, ledger("g", &[1, 2, 3, 4]));
    let v = judge_ledgers(&accepted, &finals);
    assert_eq!(v.missing[&1], 2);
    assert!(!v.state_hashes_equal);
    // An unreadable ledger never agrees.
    let mut broken = ledger("h", &[1, 2, 3]);
    broken.error = Some("corrupt".into());
    let finals = BTreeMap::from([(0, ledger("h", &[1, 2, 3])), (1, broken)]);
    assert!(!judge_ledgers(&accepted, &finals).state_hashes_equal);
}

/// A soak where everything went right: two kills recovered, one partition healed, a flood
/// the victim stepped through, ledgers equal, memory under the bound.
fn good_soak() -> Soak {
    let c = Chaos::default();
    let mut s = Soak {
        bounds: Some(c.bounds),
        planned: 6,
        applied: 6,
        ..Soak::default()
    };
    for (node, at) in [(2, 10_000), (3, 50_000)] {
        s.kills.push(KillRecord {
            node,
            killed_ms: at,
            restart_after_ms: Some(3_000),
            restarted_ms: Some(at + 3_000),
            ..KillRecord::default()
        });
        s.on_event(node, &step(1, at + 9_000), at + 9_000);
    }
    s.cuts.push(crate::soak::CutRecord {
        node: 4,
        cut_ms: 60_000,
        healed_ms: Some(80_000),
        ..Default::default()
    });
    s.on_event(4, &step(1, 85_000), 85_000);
    s.flood = Some(FloodRecord {
        node: 5,
        start_ms: 1_000,
        ..FloodRecord::default()
    });
    s.on_event(5, &step(0, 2_000), 2_000);
    s.flood.as_mut().unwrap().stop_ms = Some(90_000);
    s.flood.as_mut().unwrap().stats = Some(FloodStats {
        junk_bytes: 10,
        gossip_sent: 5,
        ..FloodStats::default()
    });
    s.note_accepted(0, &[[1; 32], [2; 32]], 5);
    s.finals = BTreeMap::from([(0, ledger("h", &[1, 2])), (1, ledger("h", &[1, 2]))]);
    s.note_memory(0, 400_000);
    s.note_memory(0, 300_000);
    s
}

fn failed(s: &Soak) -> Vec<String> {
    s.checks(Some(5.0), Some(3.0))
        .into_iter()
        .filter(|c| !c.ok)
        .map(|c| c.name)
        .collect()
}

#[test]
fn a_good_soak_passes_and_each_fault_fails_its_check() {
    let good = good_soak();
    assert_eq!(failed(&good), Vec::<String>::new());
    assert_eq!(good.kills[0].recovery_ms(), Some(6_000));
    assert_eq!(good.cuts[0].recovery_ms(), Some(5_000));
    assert_eq!(good.peak_kb[&0], 400_000);
    let json = good.to_json(Some(5.0), Some(3.0));
    assert_eq!(json["pass"], true);
    assert_eq!(json["recovery_ms"]["max"], 6_000);
    assert_eq!(json["kills_recovered"], 2);

    let s = good_soak();
    let names = |s: &Soak, a, b| {
        s.checks(a, b)
            .into_iter()
            .filter(|c| !c.ok)
            .map(|c| c.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&s, Some(5.0), Some(4.9)), ["training_progressed"]);
    assert_eq!(
        names(&s, Some(5.0), Some(f64::NAN)),
        ["training_progressed"]
    );
    assert_eq!(names(&s, None, Some(3.0)), ["training_progressed"]);

    let mut s = good_soak();
    s.cut_short = true;
    assert_eq!(failed(&s), ["chaos_window_completed"]);
    let mut s = good_soak();
    s.applied = 5;
    assert_eq!(failed(&s), ["chaos_window_completed"]);

    // A kill whose node stepped again too late, one that never did, and no kill at all.
    let mut s = good_soak();
    s.kills[1].first_step_ms = Some(53_000 + 60_001);
    assert_eq!(failed(&s), ["kills_recovered"]);
    let mut s = good_soak();
    s.kills[1].first_step_ms = None;
    assert_eq!(failed(&s), ["kills_recovered"]);
    let mut s = good_soak();
    s.kills.clear();
    assert_eq!(failed(&s), ["kills_recovered"]);

    let mut s = good_soak();
    s.cuts[0].first_step_after_heal_ms = None;
    assert_eq!(failed(&s), ["partition_recovered"]);

    // An entry seen accepted that no final ledger holds.
    let mut s = good_soak();
    s.note_accepted(3, &[[9; 32]], 7);
    assert_eq!(failed(&s), ["no_entry_lost"]);
    let mut s = good_soak();
    s.finals.insert(1, ledger("h", &[1]));
    assert_eq!(failed(&s), ["no_entry_lost"]);
    // A node once counted three proofs; the final ledgers hold two.
    let mut s = good_soak();
    s.on_event(2, &stats(3), 9);
    assert_eq!(failed(&s), ["no_entry_lost"]);
    let mut s = good_soak();
    s.on_event(2, &stats(2), 9);
    assert_eq!(failed(&s), Vec::<String>::new());
    let mut s = good_soak();
    s.finals.insert(1, ledger("other", &[1, 2]));
    assert_eq!(failed(&s), ["ledgers_agree"]);

    let mut s = good_soak();
    s.note_memory(3, 2_048 * 1024 + 1);
    assert_eq!(failed(&s), ["memory_bounded"]);

    let mut s = good_soak();
    s.flood.as_mut().unwrap().victim_steps = 0;
    assert_eq!(failed(&s), ["flood_victim_kept_stepping"]);
    let mut s = good_soak();
    s.flood.as_mut().unwrap().stats = None;
    assert_eq!(failed(&s), ["flood_victim_kept_stepping"]);

    let mut s = good_soak();
    s.unexpected_exits.push((2, "signal 6".into()));
    assert_eq!(failed(&s), ["no_unexpected_exit"]);
}

#[test]
fn recovery_is_timed_from_events_of_the_restarted_node_only() {
    let mut s = Soak::default();
    s.kills.push(KillRecord {
        node: 2,
        killed_ms: 1_000,
        ..KillRecord::default()
    });
    // Not restarted yet: its steps (late lines of the killed process) do not count.
    s.on_event(2, &step(1, 1_500), 1_500);
    assert_eq!(s.kills[0].first_step_ms, None);
    s.kills[0].restarted_ms = Some(4_000);
    s.on_event(3, &step(1, 4_500), 4_500);
    assert_eq!(s.kills[0].first_step_ms, None, "another node's step");
    s.on_event(2, &step(1, 7_000), 7_000);
    s.on_event(2, &step(1, 8_000), 8_000);
    assert_eq!(s.kills[0].recovery_ms(), Some(3_000));
}

#[test]
fn peak_memory_and_flood_targets_are_read() {
    let status = "Name:\tneuroshard\nVmPeak:\t  900 kB\nVmHWM:\t  123456 kB\nVmRSS:\t 1 kB\n";
    assert_eq!(parse_hwm(status), Some(123_456));
    assert_eq!(parse_hwm("Name: x\n"), None);
    let addrs = vec![
        "/ip4/10.77.0.3/udp/4001/quic-v1/p2p/16Uiu2X".to_string(),
        "/ip4/10.77.0.3/tcp/4242/p2p/16Uiu2X".to_string(),
    ];
    let (sock, full) = tcp_target(&addrs).unwrap();
    assert_eq!(sock.to_string(), "10.77.0.3:4242");
    assert_eq!(full, addrs[1]);
    assert!(tcp_target(&addrs[..1]).is_none());
}
