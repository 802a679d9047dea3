//! Serving end to end: `neuroshard swarm --serve` of 3 stages on 127.0.0.1 prints node 0's
//! API URL, keeps serving after training, and a plain HTTP client gets completions (the same
//! for the same seed), a server-sent event stream ending in `[DONE]`, and a 404 for an unknown
//! model; `/api/status` lists the swarm's three nodes, `promtool` accepts `/metrics`, the
//! dashboard's URL is printed and `/` serves the page.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::*;

use serde_json::{Value, json};

fn post(addr: &str, body: &Value) -> (u16, String) {
    let body = body.to_string();
    request(
        addr,
        &format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn get(addr: &str, path: &str) -> (u16, String) {
    request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}

/// Whether `promtool check metrics` accepts `text`; none when promtool is missing outside CI.
fn promtool_accepts(text: &str) -> Option<Result<(), String>> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is needed under CI (apt-get install prometheus): {e}"
            );
            eprintln!("promtool not found ({e}): the /metrics check is skipped");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Some(if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    })
}

fn request(addr: &str, raw: &str) -> (u16, String) {
    let mut c = TcpStream::connect(addr).expect("the API listens");
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    c.write_all(raw.as_bytes()).unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().expect("a status line");
    let body = resp
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

#[test]
fn a_swarm_serves_completions_to_an_http_client_after_training() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_genesis(dir.path());
    let out = dir.path().join("model");
    let mut child = Command::new(env!("CARGO_BIN_EXE_neuroshard"))
        .args([
            "swarm",
            "--nodes",
            "3",
            "--stages",
            "3",
            "--steps",
            "4",
            "--settle-s",
            "1",
            "--serve",
        ])
        .args(TINY)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut addr = None;
    let mut dashboard = None;
    let mut serving = false;
    while !serving {
        let line = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("the swarm trains, then serves");
        if let Some(rest) = line.split("API: http://").nth(1) {
            addr = rest.split('/').next().map(str::to_string);
        }
        if let Some(rest) = line.split("dashboard: http://").nth(1) {
            dashboard = rest.split('/').next().map(str::to_string);
        }
        serving = line.contains("training done");
    }
    let addr = addr.expect("the API's URL was printed");
    assert_eq!(
        dashboard.as_deref(),
        Some(addr.as_str()),
        "the dashboard's URL"
    );
    let (status, page) = get(&addr, "/");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<title>NeuroShard node</title>"), "{page}");
    let (status, body) = get(&addr, "/api/status");
    assert_eq!(status, 200, "{body}");
    let s: Value = serde_json::from_str(&body).unwrap();
    let nodes = s["nodes"].as_array().expect("a node list");
    let mut ids: Vec<&str> = nodes.iter().filter_map(|n| n["node"].as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "every node of the swarm, once: {s}");
    let mut stages: Vec<u64> = nodes.iter().filter_map(|n| n["stage"].as_u64()).collect();
    stages.sort_unstable();
    assert_eq!(stages, [0, 1, 2], "{s}");
    assert_eq!(nodes.iter().filter(|n| n["self"] == true).count(), 1, "{s}");
    assert_eq!(s["stages"], 3, "{s}");
    let (status, metrics) = get(&addr, "/metrics");
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("neuroshard_peers "), "{metrics}");
    if let Some(verdict) = promtool_accepts(&metrics) {
        verdict.unwrap_or_else(|e| panic!("promtool check metrics: {e}\n{metrics}"));
    }
    let req = json!({"prompt": "The ", "max_tokens": 8, "seed": 5, "temperature": 0.9});
    let (status, first) = post(&addr, &req);
    assert_eq!(status, 200, "{first}");
    let first: Value = serde_json::from_str(&first).unwrap();
    let tokens = first["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&tokens), "{first}");
    let (_, second) = post(&addr, &req);
    let second: Value = serde_json::from_str(&second).unwrap();
    assert_eq!(first["choices"][0]["text"], second["choices"][0]["text"]);
    let (status, sse) = post(
        &addr,
        &json!({"prompt": "The ", "max_tokens": 4, "stream": true}),
    );
    assert_eq!(status, 200);
    assert!(sse.contains("data: [DONE]"), "{sse}");
    assert!(sse.contains("\"object\":\"text_completion\""), "{sse}");
    let (status, err) = post(&addr, &json!({"model": "gpt-4", "prompt": "hi"}));
    assert_eq!(status, 404, "{err}");
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
