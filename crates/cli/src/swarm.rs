//! `neuroshard swarm`: a local network of real node processes on 127.0.0.1 training one
//! model as pipeline stages with replicas, with live progress, an optional chaos kill, and
//! the assembled model written as a checkpoint at the end.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use neuroshard_data::Genesis;
use neuroshard_model::{ParamSet, Stage, StageSpec, checkpoint};
use serde_json::Value;

use crate::node::SyncArgs;
use crate::swarm_report::{Assembly, Report, assemble, now_ms};
use crate::train::{ModelArgs, StepArgs, open_or_build_default};

#[derive(Args)]
pub struct SwarmArgs {
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Genesis dataset (default: the built-in synthetic corpus, built on first use).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Optimizer steps per driver.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// The assembled model (all stages and the tokenizer) is written here.
    #[arg(long, default_value = "runs/swarm")]
    out: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    step: StepArgs,
    #[command(flatten)]
    sync: SyncArgs,
    /// Byzantine nodes (indices, comma-separated) that send --attack instead of their
    /// pseudo-gradient, e.g. `--attackers 4,5`.
    #[arg(long, value_delimiter = ',')]
    attackers: Vec<usize>,
    /// The attackers' pseudo-gradient: sign-flip, scale:K, gaussian:S, alie, ipm:E, zeros.
    #[arg(long, default_value = "sign-flip")]
    attack: String,
    /// Start one more node once the drivers reach this step; it joins mid-run.
    #[arg(long)]
    join_at: Option<u64>,
    /// After the drivers finish: wait up to this long for every ledger to agree.
    #[arg(long, default_value_t = 30)]
    settle_s: u64,
    /// Engine threads per node.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Drivers train on the global order of `neuroshard train` instead of their assignment.
    #[arg(long)]
    global_order: bool,
    /// Chaos: SIGKILL node NODE once the drivers reach STEP, e.g. `--kill 3@20`.
    #[arg(long)]
    kill: Option<String>,
    /// With --kill: start the killed node again after this many milliseconds; it resumes from
    /// its latest speculative checkpoint and rejoins.
    #[arg(long)]
    restart_after_ms: Option<u64>,
    /// Speculative checkpoint period of every node, in seconds.
    #[arg(long, default_value_t = 120)]
    checkpoint_secs: u64,
    /// Write the run's figures as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Give up after this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    timeout_s: u64,
    #[arg(long, default_value = "The")]
    prompt: String,
    /// Tokens generated from the trained model at the end (0: skip).
    #[arg(long, default_value_t = 40)]
    gen_tokens: usize,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub struct Member {
    pub index: usize,
    pub child: Child,
    pub dir: PathBuf,
    pub stage: Option<usize>,
    pub role: String,
    pub alive: bool,
    pub stopped: Option<Value>,
}

fn parse_kill(spec: &str, nodes: usize) -> Result<(usize, u64)> {
    let (n, s) = spec
        .split_once('@')
        .with_context(|| format!("--kill {spec:?}: expected NODE@STEP"))?;
    let node: usize = n.parse().with_context(|| format!("--kill node {n:?}"))?;
    let step: u64 = s.parse().with_context(|| format!("--kill step {s:?}"))?;
    if node >= nodes {
        bail!("--kill node {node} does not exist ({nodes} nodes)");
    }
    Ok((node, step))
}

pub fn run(args: SwarmArgs) -> Result<()> {
    if args.nodes < args.stages || args.stages == 0 {
        bail!(
            "--nodes {} cannot hold --stages {}",
            args.nodes,
            args.stages
        );
    }
    if let Some(a) = args.attackers.iter().find(|a| **a >= args.nodes) {
        bail!(
            "--attackers: node {a} does not exist ({} nodes)",
            args.nodes
        );
    }
    let kill = args
        .kill
        .as_deref()
        .map(|k| parse_kill(k, args.nodes))
        .transpose()?;
    let genesis = open_or_build_default(args.data.as_deref(), &args.out)?;
    let config = args.model.config(genesis.vocab_size(), args.step.seq)?;
    StageSpec::split(&config, args.stages)?;
    // SAFETY: installing a handler that only stores to an atomic is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        );
    }
    let root = nodes_dir(&args.out);
    let exe = std::env::current_exe().context("locating the neuroshard binary")?;
    let (tx, rx) = mpsc::channel::<(usize, Value)>();
    let mut members: Vec<Member> = Vec::new();
    let mut bootstrap: Option<String> = None;
    let started = Instant::now();
    let mut report = Report::new(args.steps);
    println!(
        "starting {} nodes ({} stages) for {} steps of {}×{} tokens; model {} parameters",
        args.nodes,
        args.stages,
        args.steps,
        args.step.batch,
        args.step.seq,
        config.num_params()
    );
    let launch = Launch {
        exe: &exe,
        args: &args,
        genesis: &genesis,
        root: &root,
        tx: tx.clone(),
    };
    for i in 0..args.nodes {
        members.push(launch.member(i, bootstrap.as_deref(), true)?);
        // Wait for its ready line so the next node sees it when choosing a stage.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || INTERRUPTED.load(Ordering::SeqCst) {
                stop_all(&mut members, &rx);
                bail!(
                    "node {i} did not become ready (see {}/node.log)",
                    members[i].dir.display()
                );
            }
            match rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok((j, ev)) if j == i && ev["event"] == "ready" => {
                    members[i].stage = ev["stage"].as_u64().map(|s| s as usize);
                    members[i].role = ev["role"].as_str().unwrap_or("").to_string();
                    if bootstrap.is_none() {
                        bootstrap = ev["addrs"]
                            .as_array()
                            .and_then(|a| a.first())
                            .and_then(|a| a.as_str())
                            .map(str::to_string);
                    }
                    println!(
                        "  node {i}: stage {} ({})",
                        members[i].stage.map_or("?".into(), |s| s.to_string()),
                        members[i].role
                    );
                    break;
                }
                // Earlier nodes may already train while later ones start.
                Ok((j, ev)) => report.on_event(j, &ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = members[i].child.try_wait() {
                        stop_all(&mut members, &rx);
                        bail!(
                            "node {i} exited ({status}); see {}/node.log",
                            members[i].dir.display()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("lost the nodes' output"),
            }
        }
    }
    report.startup = started.elapsed();
    let bar = ProgressBar::new(args.steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
            .map_err(|e| anyhow::anyhow!("progress template: {e}"))?,
    );
    let deadline = (args.timeout_s > 0).then(|| started + Duration::from_secs(args.timeout_s));
    let mut killed = false;
    let mut settle_since: Option<Instant> = None;
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            bar.println("interrupted: stopping every node");
            break;
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            bar.println("time limit reached: stopping every node");
            report.timed_out = true;
            break;
        }
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok((i, ev)) => report.on_event(i, &ev),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        for m in members.iter_mut().filter(|m| m.alive) {
            if let Ok(Some(status)) = m.child.try_wait() {
                m.alive = false;
                bar.println(format!("node {} exited unexpectedly ({status})", m.index));
            }
        }
        if let Some((victim, at)) = kill
            && !killed
            && report.max_driver_step() >= at
        {
            let m = &mut members[victim];
            // SIGKILL: no deathrattle, no checkpoint — a crash.
            unsafe {
                libc::kill(m.child.id() as libc::pid_t, libc::SIGKILL);
            }
            let _ = m.child.wait();
            m.alive = false;
            killed = true;
            report.kill_time_ms = Some(now_ms());
            report.killed = Some(victim);
            bar.println(format!(
                "chaos: killed node {victim} (stage {:?}) at step {at}",
                m.stage
            ));
        }
        if let (Some(after), Some(victim), Some(killed_at)) =
            (args.restart_after_ms, report.killed, report.kill_time_ms)
            && report.restart_time_ms.is_none()
            && now_ms() >= killed_at + after
        {
            let m = &mut members[victim];
            m.child = launch.spawn(&m.dir, bootstrap.as_deref(), victim)?;
            m.alive = true;
            report.restart_time_ms = Some(now_ms());
            bar.println(format!(
                "chaos: restarted node {victim} from its checkpoint"
            ));
        }
        if let Some(at) = args.join_at
            && report.joiner.is_none()
            && report.max_driver_step() >= at
        {
            let index = members.len();
            members.push(launch.member(index, bootstrap.as_deref(), false)?);
            report.joiner = Some((index, now_ms()));
            bar.println(format!("node {index} joins at step {at}"));
        }
        for m in members.iter_mut().filter(|m| m.stage.is_none()) {
            m.stage = report.stage_of(m.index);
        }
        bar.set_position(report.min_driver_step(&members));
        bar.set_message(report.progress_line(&members, args.stages));
        let drivers: Vec<&Member> = members
            .iter()
            .filter(|m| m.alive && m.stage == Some(0))
            .collect();
        if drivers.is_empty() {
            bar.println("no driver is alive: stopping");
            break;
        }
        if drivers.iter().all(|m| report.finished.contains(&m.index)) {
            // Let the last proofs spread: stop once every ledger agrees (or time is up).
            let since = *settle_since.get_or_insert_with(Instant::now);
            let live: Vec<usize> = members
                .iter()
                .filter(|m| m.alive)
                .map(|m| m.index)
                .collect();
            if report.ledgers_settled(&live) || since.elapsed() > Duration::from_secs(args.settle_s)
            {
                break;
            }
        }
    }
    bar.finish();
    stop_all(&mut members, &rx);
    for m in &members {
        if let Some(ev) = &m.stopped {
            report.on_stopped(m.index, ev);
        }
    }
    let assembly = assemble(&members, &config, &args.out, &genesis, args.stages)?;
    finish(&args, &genesis, &config, &assembly, &mut report)
}

fn finish(
    args: &SwarmArgs,
    genesis: &Genesis,
    config: &neuroshard_model::ModelConfig,
    assembly: &Assembly,
    report: &mut Report,
) -> Result<()> {
    let val = crate::eval::val_batches(genesis, args.step.batch, args.step.seq, 4)?;
    let full = StageSpec::full(config);
    let initial = Stage::from_params(
        config.clone(),
        full,
        ParamSet::init(full.param_specs(config), args.step.seed),
    )?;
    if !val.is_empty() {
        report.initial_val = Some(crate::eval::evaluate(&initial, genesis.tokenizer(), &val)?.loss);
        report.final_val =
            Some(crate::eval::evaluate(&assembly.stage, genesis.tokenizer(), &val)?.loss);
    }
    if args.gen_tokens > 0 {
        let tok = genesis.tokenizer();
        let prompt = tok.encode(&args.prompt)?;
        let generator = neuroshard_model::Generator::new(assembly.stage.clone())?;
        let sampling = neuroshard_model::Sampling {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            seed: args.step.seed,
            stop_token: Some(tok.eos_id()),
        };
        let out = generator.generate(&prompt, args.gen_tokens, &sampling)?;
        report.sample = Some(format!("{}{}", args.prompt, tok.decode(&out)?));
    }
    report.print(&args.out);
    if let Some(path) = &args.summary_json {
        let text = serde_json::to_string_pretty(&report.to_json(assembly))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if report.driver_steps_total() == 0 {
        bail!("no training step completed");
    }
    Ok(())
}

/// Starts node processes of this swarm.
struct Launch<'a> {
    exe: &'a Path,
    args: &'a SwarmArgs,
    genesis: &'a Genesis,
    root: &'a Path,
    tx: mpsc::Sender<(usize, Value)>,
}

impl Launch<'_> {
    fn spawn(&self, dir: &Path, bootstrap: Option<&str>, index: usize) -> Result<Child> {
        spawn_node(
            self.exe,
            self.args,
            self.genesis,
            dir,
            bootstrap,
            index,
            self.tx.clone(),
        )
    }

    /// Node `index` starting afresh: no checkpoint to resume and no ledger of an earlier run.
    /// `keep_key` keeps its key (and with it its data assignment) from an earlier run; a
    /// joiner gets a new identity.
    fn member(&self, index: usize, bootstrap: Option<&str>, keep_key: bool) -> Result<Member> {
        let dir = self.root.join(format!("node-{index}"));
        if keep_key {
            let _ = std::fs::remove_dir_all(dir.join("checkpoint"));
            for suffix in ["", "-wal", "-shm"] {
                let ledger = format!("{}{suffix}", neuroshard_ledger::LEDGER_FILE);
                let _ = std::fs::remove_file(dir.join(ledger));
            }
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let child = self.spawn(&dir, bootstrap, index)?;
        Ok(Member {
            index,
            child,
            dir,
            stage: None,
            role: String::new(),
            alive: true,
            stopped: None,
        })
    }
}

/// Node data directories live beside the output.
fn nodes_dir(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("swarm".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!("{name}-nodes"))
}

fn spawn_node(
    exe: &Path,
    args: &SwarmArgs,
    genesis: &Genesis,
    dir: &Path,
    bootstrap: Option<&str>,
    index: usize,
    tx: mpsc::Sender<(usize, Value)>,
) -> Result<Child> {
    let log = File::create(dir.join("node.log"))
        .with_context(|| format!("creating {}/node.log", dir.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("node")
        .arg("--data-dir")
        .arg(dir)
        .arg("--data")
        .arg(genesis.dir())
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .args(["--stages", &args.stages.to_string()])
        .args(args.model.to_args())
        .args(args.step.to_args())
        .args(args.sync.to_args())
        .args([
            "--attack",
            if args.attackers.contains(&index) {
                &args.attack
            } else {
                "none"
            },
        ])
        .args(["--steps", &args.steps.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .args(["--settle-ms", if index == 0 { "200" } else { "2500" }])
        .args(["--wait-peers", &(args.nodes - 1).to_string()])
        .args(["--checkpoint-secs", &args.checkpoint_secs.to_string()])
        .args([
            "--data-order",
            if args.global_order {
                "global"
            } else {
                "assigned"
            },
        ]);
    if let Some(b) = bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    cmd.env(
        "RUST_LOG",
        std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::from(log));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting node {index}"))?;
    let stdout = child.stdout.take().context("node stdout")?;
    // Every event line is also kept beside the node's log.
    let mut events = File::create(dir.join("events.jsonl"))
        .with_context(|| format!("creating {}/events.jsonl", dir.display()))?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(events, "{line}");
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && tx.send((index, v)).is_err()
            {
                break;
            }
        }
    });
    Ok(child)
}

/// SIGTERM to every live node, then wait for each to checkpoint and exit (SIGKILL after 30 s).
fn stop_all(members: &mut [Member], rx: &mpsc::Receiver<(usize, Value)>) {
    for m in members.iter().filter(|m| m.alive) {
        unsafe {
            libc::kill(m.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while members.iter().any(|m| m.alive) && Instant::now() < deadline {
        while let Ok((i, ev)) = rx.recv_timeout(Duration::from_millis(100)) {
            if ev["event"] == "stopped"
                && let Some(m) = members.get_mut(i)
            {
                m.stopped = Some(ev);
            }
        }
        for m in members.iter_mut().filter(|m| m.alive) {
            if let Ok(Some(_)) = m.child.try_wait() {
                m.alive = false;
            }
        }
    }
    // Late lines from nodes that already exited.
    while let Ok((i, ev)) = rx.recv_timeout(Duration::from_millis(50)) {
        if ev["event"] == "stopped"
            && let Some(m) = members.get_mut(i)
        {
            m.stopped = Some(ev);
        }
    }
    for m in members.iter_mut().filter(|m| m.alive) {
        let _ = m.child.kill();
        let _ = m.child.wait();
        m.alive = false;
    }
}

/// Checkpoints of the replica of each stage with the most steps.
pub fn best_replicas(members: &[Member], stages: usize) -> Result<BTreeMap<usize, PathBuf>> {
    let mut best: BTreeMap<usize, (u64, PathBuf)> = BTreeMap::new();
    for m in members {
        let Some(ev) = &m.stopped else { continue };
        if ev["error"].is_string() {
            continue;
        }
        let (Some(stage), Some(step), Some(dir)) = (
            ev["stage"].as_u64(),
            ev["step"].as_u64(),
            ev["checkpoint"].as_str(),
        ) else {
            continue;
        };
        let entry = best.entry(stage as usize).or_insert((0, PathBuf::new()));
        if entry.1.as_os_str().is_empty() || step > entry.0 {
            *entry = (step, PathBuf::from(dir));
        }
    }
    if best.len() != stages {
        bail!(
            "only stages {:?} of {stages} have a saved replica; cannot assemble the model",
            best.keys().collect::<Vec<_>>()
        );
    }
    checkpoint::read_meta(&best[&0].1).context("reading the driver's checkpoint")?;
    Ok(best.into_iter().map(|(s, (_, p))| (s, p)).collect())
}
