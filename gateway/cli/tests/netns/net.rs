//! The test's own network: three node namespaces, each with a veth into a bridge that lives in
//! a fourth ("switch") namespace, and one veth from this (the root) namespace into the switch,
//! so the test reaches every node while it stays where it is. Addresses are a /24 of
//! 198.18.0.0/15 (RFC 2544's benchmark range) picked from the test's pid, skipping any /24 the
//! root namespace already has a route or address in; the root namespace gets one interface, its
//! address and so the route to that /24, nothing else. The faults: iptables `DROP` rules in a
//! node's namespace (partitions), and a bad link on every node's interface (`tc netem`, or where
//! the kernel has no `sch_netem` its user-space stand-in: `nfqueue.rs` and `iptables -j TEE`).
//! [`Net`]'s `Drop` deletes the namespaces and the root-side veth, also when the test panics.

use std::process::Command;
use std::time::Duration;

use super::nfqueue::{Counts, Delayer, Profile};

/// The network of one run (names carry the test's pid).
pub struct Net {
    /// `198.A.B`: the run's /24.
    pub prefix: String,
    /// The switch's namespace.
    pub switch: String,
    /// The nodes' namespaces.
    pub nodes: Vec<String>,
    /// Each node's interface (in its namespace).
    pub ifaces: Vec<String>,
    /// The root namespace's end of its veth into the switch.
    pub host_if: String,
    /// Whether the kernel has `sch_netem` (else the user-space stand-in is used).
    pub netem: bool,
    delayers: Vec<Delayer>,
}

/// Which way a partition drops packets, seen from the node it is made in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Both directions.
    Both,
    /// Only what the node receives from the others.
    Inbound,
    /// Only what the node sends to the others.
    Outbound,
}

/// A bad link, on every node's interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weather {
    /// `delay 50ms 25ms loss 5%`.
    Lossy,
    /// `delay 50ms reorder 25% 50%`: a quarter of the packets overtake the others.
    Reordering,
    /// `delay 50ms 25ms duplicate 5%`.
    Duplicating,
}

impl Weather {
    /// netem's arguments.
    pub fn netem(self) -> &'static [&'static str] {
        match self {
            Weather::Lossy => &["delay", "50ms", "25ms", "loss", "5%"],
            Weather::Reordering => &["delay", "50ms", "reorder", "25%", "50%"],
            Weather::Duplicating => &["delay", "50ms", "25ms", "duplicate", "5%"],
        }
    }

    /// The same in user space (duplicates are iptables' `TEE`).
    fn profile(self) -> Profile {
        let ms = Duration::from_millis;
        match self {
            Weather::Lossy => Profile {
                delay: ms(50),
                jitter: ms(25),
                loss: 0.05,
                immediate: 0.0,
            },
            Weather::Reordering => Profile {
                delay: ms(50),
                jitter: ms(0),
                loss: 0.0,
                immediate: 0.25,
            },
            Weather::Duplicating => Profile {
                delay: ms(50),
                jitter: ms(25),
                loss: 0.0,
                immediate: 0.0,
            },
        }
    }
}

/// Runs `program args`; panics with its output if it fails.
pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `program args`, whether it fails or not: its success and output.
pub fn try_run(program: &str, args: &[&str]) -> (bool, String) {
    match Command::new(program).args(args).output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

/// The namespace names of a run of process `pid`.
fn ns_prefix(pid: u32) -> String {
    format!("boxoffice-{pid}-")
}

/// Deletes what a run of a process that is gone (or had this process's pid) left behind: a
/// test killed outright (`SIGKILL`) runs no `Drop`.
fn remove_leftovers(me: u32) {
    let (_, list) = try_run("ip", &["netns", "list"]);
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("boxoffice-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("netns: removing {name}, left behind by process {pid}");
            let _ = try_run("ip", &["netns", "del", name]);
            let _ = try_run("ip", &["link", "del", &format!("bo{pid}h")]);
        }
    }
}

impl Net {
    /// Makes the network (see the module's doc). Panics if a step fails (what was made is
    /// removed again).
    pub fn create() -> Net {
        let pid = std::process::id();
        remove_leftovers(pid);
        let prefix = free_prefix(pid);
        let ns = ns_prefix(pid);
        let mut net = Net {
            prefix,
            switch: format!("{ns}sw"),
            nodes: (1..=3).map(|i| format!("{ns}n{i}")).collect(),
            ifaces: (1..=3).map(|i| format!("bo{pid}n{i}")).collect(),
            host_if: format!("bo{pid}h"),
            netem: false,
            delayers: Vec::new(),
        };
        let sw = net.switch.clone();
        let bridge = format!("bo{pid}br");
        run("ip", &["netns", "add", &sw]);
        run("ip", &["-n", &sw, "link", "set", "lo", "up"]);
        run(
            "ip",
            &["-n", &sw, "link", "add", "name", &bridge, "type", "bridge"],
        );
        run("ip", &["-n", &sw, "link", "set", &bridge, "up"]);
        for i in 0..3 {
            let node = net.nodes[i].clone();
            let iface = net.ifaces[i].clone();
            let port = format!("bo{pid}s{}", i + 1);
            run("ip", &["netns", "add", &node]);
            run("ip", &["-n", &node, "link", "set", "lo", "up"]);
            run(
                "ip",
                &[
                    "-n", &sw, "link", "add", "name", &port, "type", "veth", "peer", "name",
                    &iface, "netns", &node,
                ],
            );
            run("ip", &["-n", &sw, "link", "set", &port, "master", &bridge]);
            run("ip", &["-n", &sw, "link", "set", &port, "up"]);
            let addr = format!("{}/24", net.addr(i));
            run("ip", &["-n", &node, "addr", "add", &addr, "dev", &iface]);
            run("ip", &["-n", &node, "link", "set", &iface, "up"]);
        }
        let up = format!("bo{pid}u");
        run(
            "ip",
            &[
                "link",
                "add",
                "name",
                &net.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &up,
                "netns",
                &sw,
            ],
        );
        run("ip", &["-n", &sw, "link", "set", &up, "master", &bridge]);
        run("ip", &["-n", &sw, "link", "set", &up, "up"]);
        // The address with its /24: the one route this adds to the root namespace.
        let host = format!("{}/24", net.host());
        run("ip", &["addr", "add", &host, "dev", &net.host_if]);
        run("ip", &["link", "set", &net.host_if, "up"]);
        // Whether the kernel has netem: tried on node 1's interface, then taken off.
        let (netem, _) = try_run(
            "ip",
            &[
                "netns",
                "exec",
                &net.nodes[0],
                "tc",
                "qdisc",
                "add",
                "dev",
                &net.ifaces[0],
                "root",
                "netem",
                "delay",
                "1ms",
            ],
        );
        if netem {
            net.tc_del(0);
        }
        net.netem = netem;
        net
    }

    /// The root namespace's address.
    pub fn host(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// Node `i`'s address (0-based).
    pub fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, 11 + i)
    }

    /// `iptables args` in node `i`'s namespace.
    fn iptables(&self, i: usize, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.nodes[i], "iptables", "-w"];
        all.extend_from_slice(args);
        run("ip", &all);
    }

    /// Cuts node `i` off from the nodes `from` (iptables `DROP` in its namespace), `way`.
    pub fn cut(&self, i: usize, from: &[usize], way: Way) {
        for &f in from {
            let peer = self.addr(f);
            if way != Way::Outbound {
                self.iptables(i, &["-A", "INPUT", "-s", &peer, "-j", "DROP"]);
            }
            if way != Way::Inbound {
                self.iptables(i, &["-A", "OUTPUT", "-d", &peer, "-j", "DROP"]);
            }
        }
    }

    /// Makes every node's link bad: netem, or its stand-in.
    pub fn degrade(&mut self, weather: Weather) {
        for i in 0..3 {
            if self.netem {
                let mut args = vec![
                    "netns",
                    "exec",
                    &self.nodes[i],
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    &self.ifaces[i],
                    "root",
                    "netem",
                ];
                args.extend_from_slice(weather.netem());
                run("ip", &args);
                continue;
            }
            let d = Delayer::start(&self.nodes[i], 0, weather.profile())
                .unwrap_or_else(|e| panic!("the delayer in {}: {e}", self.nodes[i]));
            self.delayers.push(d);
            let iface = self.ifaces[i].clone();
            self.iptables(
                i,
                &[
                    "-A",
                    "OUTPUT",
                    "-o",
                    &iface,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    "0",
                    "--queue-bypass",
                ],
            );
            if weather == Weather::Duplicating {
                let mut to: Vec<String> =
                    (0..3).filter(|j| *j != i).map(|j| self.addr(j)).collect();
                to.push(self.host());
                for dst in &to {
                    self.iptables(
                        i,
                        &[
                            "-t",
                            "mangle",
                            "-A",
                            "POSTROUTING",
                            "-o",
                            &iface,
                            "-d",
                            dst,
                            "-m",
                            "statistic",
                            "--mode",
                            "random",
                            "--probability",
                            "0.05",
                            "-j",
                            "TEE",
                            "--gateway",
                            dst,
                        ],
                    );
                }
            }
        }
    }

    fn tc_del(&self, i: usize) {
        let _ = try_run(
            "ip",
            &[
                "netns",
                "exec",
                &self.nodes[i],
                "tc",
                "qdisc",
                "del",
                "dev",
                &self.ifaces[i],
                "root",
            ],
        );
    }

    /// Heals everything: every rule and qdisc removed, the delayers stopped (what they hold
    /// goes on); what the delayers did.
    pub fn heal(&mut self) -> Counts {
        for i in 0..3 {
            self.iptables(i, &["-F"]);
            self.iptables(i, &["-t", "mangle", "-F"]);
            if self.netem {
                self.tc_del(i);
            }
        }
        let mut all = Counts::default();
        for d in self.delayers.drain(..) {
            let c = d.stop();
            all.delayed += c.delayed;
            all.immediate += c.immediate;
            all.dropped += c.dropped;
        }
        all
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // The delayers first: their sockets would keep a namespace alive after its name goes.
        self.delayers.clear();
        for ns in self.nodes.iter().chain(std::iter::once(&self.switch)) {
            let (ok, out) = try_run("ip", &["netns", "del", ns]);
            if !ok {
                eprintln!("netns: deleting {ns}: {out}");
            }
        }
        // Gone with the switch's end already; deleted again in case the switch never had it.
        let _ = try_run("ip", &["link", "del", &self.host_if]);
    }
}

/// A /24 of 198.18.0.0/15 from `pid`, the first one (from there, in turn) that the root
/// namespace has no route or address in.
fn free_prefix(pid: u32) -> String {
    let (_, routes) = try_run("ip", &["-4", "route", "show", "table", "all"]);
    let (_, addrs) = try_run("ip", &["-4", "-o", "addr", "show"]);
    for k in 0..512 {
        let n = (pid + k) % 512;
        let prefix = format!("198.{}.{}", 18 + n / 256, n % 256);
        let dotted = format!("{prefix}.");
        if !routes.contains(&dotted) && !addrs.contains(&dotted) {
            return prefix;
        }
    }
    panic!("every /24 of 198.18.0.0/15 is in use here");
}
