//! Real processes on 127.0.0.1: a stranger plants another network's genesis in the DHT of a
//! running network; nodes still start, a joiner that names the network by id takes its
//! genesis (and with it the model), and one that names none takes its bootstrap peer's. And a
//! node whose log cannot be written (a full disk) keeps running.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{s, tiny_genesis};
use serde_json::Value;

/// A node process; killed when dropped.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `neuroshard node` with `args` and waits (at most 60 s) for its `ready` event.
fn start(dir: &Path, data: &str, args: &[&str]) -> (Node, Value) {
    start_logging(dir, data, args, ("warn", Stdio::null()))
}

/// The same, logging at `level` into `log`.
fn start_logging(dir: &Path, data: &str, args: &[&str], log: (&str, Stdio)) -> (Node, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_neuroshard"))
        .args(["node", "--data-dir", s(dir), "--data", data])
        .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--settle-ms", "500"])
        .args(args)
        .env("RUST_LOG", log.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.1)
        .spawn()
        .expect("the neuroshard binary runs");
    let stdout = child.stdout.take().expect("stdout pipe");
    let node = Node(child);
    let ready = ready_event(stdout);
    (node, ready)
}

fn ready_event(stdout: ChildStdout) -> Value {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["event"] == "ready"
            {
                let _ = tx.send(v);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the node reported ready within 60 s")
}

const MODEL: [&str; 10] = [
    "--stages",
    "1",
    "--layers",
    "2",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--seq",
    "16",
];

#[test]
fn a_planted_foreign_genesis_stops_no_node_and_misleads_no_joiner() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());
    let data = s(&data);
    // The network: one founding node.
    let (_a, a) = start(&dir.path().join("a"), data, &MODEL);
    let network = a["network"].as_str().expect("network id").to_string();
    let bootstrap = a["addrs"][0].as_str().expect("an address").to_string();

    // A stranger founds another network (another model) on its own, then connects to ours
    // and, following its own genesis, publishes it under the network key of our DHT.
    let stranger = dir.path().join("b");
    let wide = [
        "--stages",
        "1",
        "--layers",
        "3",
        "--d-model",
        "48",
        "--heads",
        "2",
    ];
    let (b_alone, _) = start(&stranger, data, &wide);
    drop(b_alone);
    let (_b, b) = start(&stranger, data, &["--bootstrap", &bootstrap]);
    assert_ne!(
        b["network"], a["network"],
        "the stranger keeps its own network"
    );

    // A joiner that names our network by id starts in our network and keeps its genesis
    // (whose protocol replaces its own model flags: `network::tests`).
    let (_c, c) = start(
        &dir.path().join("c"),
        data,
        &[
            "--bootstrap",
            &bootstrap,
            "--network",
            &network,
            "--d-model",
            "64",
        ],
    );
    assert_eq!(c["network"].as_str(), Some(network.as_str()));
    let saved = std::fs::read(dir.path().join("c").join("network.genesis")).unwrap();
    let founders = std::fs::read(dir.path().join("a").join("network.genesis")).unwrap();
    assert_eq!(saved, founders);

    // A joiner that names no network follows the peer it bootstraps from, not the stranger's
    // genesis under the DHT's network key (which it took, or refused to choose from, before).
    let (_d, d) = start(
        &dir.path().join("d"),
        data,
        &["--bootstrap", &bootstrap, "--d-model", "64"],
    );
    assert_eq!(d["network"].as_str(), Some(network.as_str()));
    let saved = std::fs::read(dir.path().join("d").join("network.genesis")).unwrap();
    assert_eq!(saved, founders);

    // And the founder restarts with the foreign genesis still in the DHT.
    drop(_a);
    let (_a2, a2) = start(&dir.path().join("a"), data, &MODEL);
    assert_eq!(a2["network"].as_str(), Some(network.as_str()));
}

/// A node's log is its stderr, which the swarm and service managers point at a file. When that
/// file's disk fills, every log write fails: the node must go on (its events still reach
/// stdout), not die. `/dev/full` fails every write with ENOSPC, as a full disk does. Before,
/// the log's error report went through `eprintln!`, which panicked on the same failure: the
/// node exited with status 101 before it was ready.
#[cfg(target_os = "linux")]
#[test]
fn a_node_whose_log_cannot_be_written_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full opens");
    let (mut node, ready) = start_logging(
        &dir.path().join("a"),
        s(&data),
        &MODEL,
        ("debug", Stdio::from(full)),
    );
    assert_eq!(ready["event"], "ready");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        node.0.try_wait().expect("waits").is_none(),
        "the node exited once its log could not be written"
    );
}
