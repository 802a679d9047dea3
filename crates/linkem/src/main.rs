//! `linkem PROFILE PREFIX NODES [SEED]`: joins network namespaces `PREFIX0`…`PREFIX{NODES-1}`
//! through their tun device `lk0` (created by `bench/links.sh`), carrying every IPv4 packet
//! for `10.77.0.{i+1}` to namespace `i` after the profile's delay and jitter, or dropping it
//! with the profile's loss. Runs until killed. Linux only; needs root (setns, tun).
//! `linkem rate PROFILE` prints the profile's uplink rate in Mbit/s (or `none`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use neuroshard_linkem::{Links, Profile, node_of};

const DEVICE: &[u8] = b"lk0";
const NET: [u8; 3] = [10, 77, 0];
/// `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Packets waiting for their arrival time: (at ns, sequence, node, bytes).
type Queue = BinaryHeap<Reverse<(u64, u64, usize, Vec<u8>)>>;

struct Shared {
    /// The queue, the link decisions and the last sequence number given out.
    state: Mutex<(Queue, Links, u64)>,
    ready: Condvar,
    start: Instant,
}

fn fail(what: &str) -> ! {
    eprintln!("linkem: {what}: {}", std::io::Error::last_os_error());
    std::process::exit(1)
}

/// Attaches to `lk0` inside namespace `ns` (the thread enters it, opens the device, returns).
fn open_tun(ns: &str, home: &File) -> File {
    let target = File::open(format!("/var/run/netns/{ns}")).unwrap_or_else(|e| {
        eprintln!("linkem: namespace {ns}: {e}");
        std::process::exit(1)
    });
    // SAFETY: setns(2) with namespace fds we hold open; it only changes this thread.
    if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        fail(&format!("entering {ns}"));
    }
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .unwrap_or_else(|e| {
            eprintln!("linkem: /dev/net/tun: {e}");
            std::process::exit(1)
        });
    let mut req = IfReq {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..DEVICE.len()].copy_from_slice(DEVICE);
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `IfReq` lays out.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } != 0 {
        fail(&format!("attaching to lk0 in {ns}"));
    }
    // SAFETY: as above, back to the namespace the process started in.
    if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        fail("returning to the initial namespace");
    }
    tun
}

/// Reads node `from`'s outgoing packets and queues each for its arrival (or drops it).
fn read_loop(from: usize, mut tun: File, nodes: usize, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let n = match tun.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("linkem: reading node {from}: {e}");
                return;
            }
        };
        let packet = &buf[..n];
        let Some(to) = node_of(packet, NET, nodes) else {
            continue;
        };
        let now = shared.start.elapsed().as_nanos() as u64;
        let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = st.1.arrival(now, from, to) {
            // The sequence number keeps packets due at the same time in the order they came.
            st.2 += 1;
            let seq = st.2;
            st.0.push(Reverse((at, seq, to, packet.to_vec())));
            shared.ready.notify_one();
        }
    }
}

/// Writes each queued packet into its node's device when its time comes.
fn write_loop(mut tuns: Vec<File>, shared: Arc<Shared>) {
    let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = shared.start.elapsed().as_nanos() as u64;
        match st.0.peek() {
            Some(Reverse((at, ..))) if *at <= now => {
                let Some(Reverse((_, _, to, packet))) = st.0.pop() else {
                    continue;
                };
                drop(st);
                // A full device queue drops the packet, as a full router queue would.
                let _ = tuns[to].write(&packet);
                st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            }
            Some(Reverse((at, ..))) => {
                let wait = Duration::from_nanos(at - now);
                st = shared
                    .ready
                    .wait_timeout(st, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            None => {
                st = shared.ready.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `linkem rate PROFILE`: the uplink rate bench/links.sh gives tbf (one table of profiles).
    if let [cmd, name] = args.as_slice()
        && cmd == "rate"
    {
        match Profile::named(name) {
            Ok(p) => println!("{}", p.mbit.map_or("none".into(), |m| m.to_string())),
            Err(e) => {
                eprintln!("linkem: {e}");
                std::process::exit(2)
            }
        }
        return;
    }
    if args.len() < 3 {
        eprintln!("usage: linkem PROFILE NS_PREFIX NODES [SEED] | linkem rate PROFILE");
        std::process::exit(2);
    }
    let profile = Profile::named(&args[0]).unwrap_or_else(|e| {
        eprintln!("linkem: {e}");
        std::process::exit(2)
    });
    let nodes: usize = match args[2].parse() {
        Ok(n) if (1..=250).contains(&n) => n,
        _ => {
            eprintln!("linkem: NODES must be 1 to 250");
            std::process::exit(2)
        }
    };
    let seed = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let home = File::open("/proc/self/ns/net").unwrap_or_else(|e| {
        eprintln!("linkem: /proc/self/ns/net: {e}");
        std::process::exit(1)
    });
    let tuns: Vec<File> = (0..nodes)
        .map(|i| open_tun(&format!("{}{i}", args[1]), &home))
        .collect();
    let shared = Arc::new(Shared {
        state: Mutex::new((BinaryHeap::new(), Links::new(profile, seed), 0)),
        ready: Condvar::new(),
        start: Instant::now(),
    });
    for (i, tun) in tuns.iter().enumerate() {
        let reader = tun.try_clone().unwrap_or_else(|e| {
            eprintln!("linkem: {e}");
            std::process::exit(1)
        });
        let shared = shared.clone();
        std::thread::spawn(move || read_loop(i, reader, nodes, shared));
    }
    eprintln!(
        "linkem: {} ({:?} one-way ± {:?}, loss {}) between {nodes} namespaces",
        profile.name, profile.delay, profile.jitter, profile.loss
    );
    write_loop(tuns, shared);
}
