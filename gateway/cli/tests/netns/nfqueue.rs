//! A bad network made in user space, for kernels without `sch_netem`: an `nfnetlink_queue`
//! client in a thread of the test, moved into a node's network namespace, gets every packet an
//! `iptables -j NFQUEUE` rule queues there and lets each go (or drops it) after a delay drawn
//! from its [`Profile`]. Packets whose delays cross leave out of order, as with netem's jitter.
//! Duplicates are not made here: `iptables -j TEE` does that (`net.rs`).
//!
//! The protocol (`linux/netfilter/nfnetlink_queue.h`): configuration messages bind the queue
//! and ask for the packets' metadata only; each queued packet comes as a message whose
//! `NFQA_PACKET_HDR` carries its id; a verdict message (`NF_ACCEPT`, `NF_DROP`) names that id.
//! The rule uses `--queue-bypass` and the queue fails open, so packets pass untouched when no
//! client listens or the queue is full, never stall.

use std::collections::BinaryHeap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::netlink::{NETFILTER, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType};

/// What happens to each packet.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// The mean delay.
    pub delay: Duration,
    /// Each packet's delay is drawn uniformly from `delay ± jitter`.
    pub jitter: Duration,
    /// The share of packets dropped.
    pub loss: f64,
    /// The share of packets let go at once (the others are delayed): netem's `reorder`.
    pub immediate: f64,
}

/// What a delayer did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub delayed: u64,
    pub immediate: u64,
    pub dropped: u64,
}

/// A running delayer (its thread): stopped, with every packet it still holds let go, by
/// [`Delayer::stop`] or when dropped.
pub struct Delayer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Counts>>,
}

// nfnetlink: subsystem QUEUE's message types, attributes and values.
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const AF_INET: u16 = 2;

impl Delayer {
    /// Starts a delayer of queue `queue` in network namespace `netns` (`/run/netns/NAME`);
    /// returns once the queue is bound (or the error binding it).
    pub fn start(netns: &str, queue: u16, profile: Profile) -> std::io::Result<Delayer> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, bound) = mpsc::channel();
        let path = format!("/run/netns/{netns}");
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nfqueue-{netns}"))
            .spawn(move || {
                let sock = match bind(&path, queue) {
                    Ok(s) => {
                        let _ = ready.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return Counts::default();
                    }
                };
                serve(&sock, queue, profile, &flag)
            })?;
        bound
            .recv()
            .map_err(|_| std::io::Error::other("the delayer's thread died"))??;
        Ok(Delayer {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the delayer; every packet it holds goes on at once.
    pub fn stop(mut self) -> Counts {
        self.halt()
    }

    fn halt(&mut self) -> Counts {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Moves this thread into `netns` and binds queue `queue` there.
fn bind(netns: &str, queue: u16) -> std::io::Result<OwnedFd> {
    let ns = std::fs::File::open(netns)?;
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    let sock = rustix::net::socket(AddressFamily::NETLINK, SocketType::RAW, Some(NETFILTER))?;
    rustix::net::bind(&sock, &SocketAddrNetlink::new(0, 0))?;
    // Room for bursts (best effort: the kernel caps it at rmem_max).
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&sock, 8 << 20);
    // BIND (the protocol family is ignored by kernels since 3.8), then the metadata only, a
    // long queue, and failing open when it is full.
    let mut cmd = vec![NFQNL_CFG_CMD_BIND, 0];
    cmd.extend_from_slice(&AF_INET.to_be_bytes());
    config(&sock, queue, &[(NFQA_CFG_CMD, cmd)])?;
    let mut params = 0u32.to_be_bytes().to_vec();
    params.push(NFQNL_COPY_META);
    config(
        &sock,
        queue,
        &[
            (NFQA_CFG_PARAMS, params),
            (NFQA_CFG_QUEUE_MAXLEN, 65_536u32.to_be_bytes().to_vec()),
            (NFQA_CFG_MASK, NFQA_CFG_F_FAIL_OPEN.to_be_bytes().to_vec()),
            (NFQA_CFG_FLAGS, NFQA_CFG_F_FAIL_OPEN.to_be_bytes().to_vec()),
        ],
    )?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_millis(1)),
    )?;
    Ok(sock)
}

/// One netlink message of subsystem QUEUE: header, `nfgenmsg` (queue `queue`), attributes.
fn message(kind: u16, flags: u16, queue: u16, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m.extend_from_slice(&[0, 0]); // nfgen_family AF_UNSPEC, version NFNETLINK_V0
    m.extend_from_slice(&queue.to_be_bytes());
    for (t, payload) in attrs {
        let len = 4 + payload.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let total = m.len() as u32;
    m[0..4].copy_from_slice(&total.to_ne_bytes());
    m[4..6].copy_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m
}

/// Sends a configuration message and waits for the kernel's acknowledgement.
fn config(sock: &OwnedFd, queue: u16, attrs: &[(u16, Vec<u8>)]) -> std::io::Result<()> {
    let m = message(NFQNL_MSG_CONFIG, NLM_F_ACK, queue, attrs);
    rustix::net::send(sock, &m, SendFlags::empty())?;
    let mut buf = vec![0u8; 8192];
    let (n, _) = rustix::net::recv(sock, &mut buf[..], RecvFlags::empty())?;
    for (kind, body) in messages(&buf[..n]) {
        if kind == NLMSG_ERROR && body.len() >= 4 {
            let errno = i32::from_ne_bytes(body[0..4].try_into().unwrap());
            if errno != 0 {
                return Err(std::io::Error::from_raw_os_error(-errno));
            }
            return Ok(());
        }
    }
    Err(std::io::Error::other(
        "no acknowledgement of a queue configuration",
    ))
}

/// The netlink messages in `buf`: (type, body after the 16-byte header).
fn messages(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        if len < 16 || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
        out.push((kind, &buf[16..len]));
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

/// The packet id of a `NFQNL_MSG_PACKET` body (`nfgenmsg`, then attributes).
fn packet_id(body: &[u8]) -> Option<u32> {
    let mut attrs = body.get(4..)?;
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes(attrs[0..2].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(attrs[2..4].try_into().unwrap()) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFQA_PACKET_HDR && len >= 8 {
            return Some(u32::from_be_bytes(attrs[4..8].try_into().unwrap()));
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    None
}

fn verdict(sock: &OwnedFd, queue: u16, id: u32, verdict: u32) {
    let mut hdr = verdict.to_be_bytes().to_vec();
    hdr.extend_from_slice(&id.to_be_bytes());
    let m = message(NFQNL_MSG_VERDICT, 0, queue, &[(NFQA_VERDICT_HDR, hdr)]);
    // A verdict that cannot be sent leaves the packet to the queue's teardown (dropped): a
    // loss, which the network under test may have anyway.
    let _ = rustix::net::send(sock, &m, SendFlags::empty());
}

/// Serves the queue until `stop`: each packet is dropped, let go at once, or held until its
/// time; at the end every held packet goes.
fn serve(sock: &OwnedFd, queue: u16, p: Profile, stop: &AtomicBool) -> Counts {
    use rand::Rng;
    let mut rng = rand::rng();
    let mut counts = Counts::default();
    // Min-heap of (due, packet id).
    let mut held: BinaryHeap<std::cmp::Reverse<(Instant, u32)>> = BinaryHeap::new();
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while let Some(std::cmp::Reverse((due, id))) = held.peek().copied() {
            if due > now {
                break;
            }
            held.pop();
            verdict(sock, queue, id, NF_ACCEPT);
        }
        let n = match rustix::net::recv(sock, &mut buf[..], RecvFlags::empty()) {
            Ok((n, _)) => n,
            // The 1 ms timeout, or packets the kernel could not hand over (they are dropped:
            // the queue fails open only when it is full).
            Err(Errno::AGAIN | Errno::INTR | Errno::NOBUFS) => continue,
            Err(_) => break,
        };
        for (kind, body) in messages(&buf[..n]) {
            if kind != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
                continue;
            }
            let Some(id) = packet_id(body) else { continue };
            if rng.random_bool(p.loss) {
                counts.dropped += 1;
                verdict(sock, queue, id, NF_DROP);
            } else if rng.random_bool(p.immediate) {
                counts.immediate += 1;
                verdict(sock, queue, id, NF_ACCEPT);
            } else {
                counts.delayed += 1;
                let low = p.delay.saturating_sub(p.jitter);
                let high = p.delay + p.jitter;
                let d = if high > low {
                    rng.random_range(low..=high)
                } else {
                    p.delay
                };
                held.push(std::cmp::Reverse((Instant::now() + d, id)));
            }
        }
    }
    for std::cmp::Reverse((_, id)) in held.drain() {
        verdict(sock, queue, id, NF_ACCEPT);
    }
    counts
}
