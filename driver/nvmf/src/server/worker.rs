//! The listener thread and the worker threads of a [`super::Server`].

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaPool};

use super::{ListenMsg, Msg, Shared, WorkerMetrics, NAP, TICK};

/// The longest sleep of an idle worker waiting for its sockets (messages from the other threads
/// and the stop wake it at once through its eventfd).
const SLEEP_MS: i32 = 1000;
/// The longest sleep of an idle worker whose connections have commands waiting for a rate
/// limit's credit.
const THROTTLED_SLEEP_MS: i32 = 1;
/// The nap of a worker past its spin time whose backends have operations in flight.
const INFLIGHT_NAP: Duration = Duration::from_micros(20);
use crate::backend::{Backend, Completion};
use crate::conn::{Conn, Ctx, Submission};
use crate::fabrics::{ConnInfo, QueueRef, SubsystemId};
use crate::pdu::TargetLimits;
use crate::sys::{Epoll, Waker};

/// Marks a connection's epoll key (its ID) apart from the descriptors of eventfds.
const CONN_KEY: u64 = 1 << 63;

/// How long a stopping worker waits for its backends' commands in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// A backend that counts its operations in flight, so that a stopping worker can wait for the
/// device to finish with the buffers before it frees them.
struct Counted {
    inner: Box<dyn Backend>,
    in_flight: Arc<AtomicU64>,
}

impl Backend for Counted {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }

    fn volatile_write_cache(&self) -> bool {
        self.inner.volatile_write_cache()
    }

    fn submit(
        &mut self,
        pool: &mut DmaPool,
        op: crate::backend::Op,
        slba: u64,
        nlb: u32,
        buf: Option<vfpoll_dma::DmaBuf>,
        tag: u64,
    ) -> Result<(), crate::backend::Busy> {
        self.inner.submit(pool, op, slba, nlb, buf, tag)?;
        // Only this worker's thread touches the counter until it ends: Relaxed suffices.
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn arm(&mut self) -> Result<std::os::fd::RawFd, bool> {
        self.inner.arm()
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let mut n = 0u64;
        self.inner.poll(&mut |c| {
            n += 1;
            done(c);
        });
        self.in_flight.fetch_sub(n, Ordering::Relaxed);
        n as usize
    }
}

/// A removed namespace's place among a worker's backends: commands still routed to it (retried
/// submissions) complete with Invalid Namespace, so indices of the others stay put.
struct Gone {
    done: VecDeque<Completion>,
}

impl Backend for Gone {
    fn block_size(&self) -> usize {
        512
    }

    fn blocks(&self) -> u64 {
        0
    }

    fn submit(
        &mut self,
        _pool: &mut DmaPool,
        _op: crate::backend::Op,
        _slba: u64,
        _nlb: u32,
        buf: Option<vfpoll_dma::DmaBuf>,
        tag: u64,
    ) -> Result<(), crate::backend::Busy> {
        self.done.push_back(Completion {
            tag,
            status: vfpoll_nvme_spec::status::Status::INVALID_NAMESPACE,
            buf,
        });
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(Completion)) -> usize {
        let n = self.done.len();
        for c in self.done.drain(..) {
            done(c);
        }
        n
    }
}

/// The listener thread: accepts connections, hands them out, advances the keep-alive timers.
/// It sleeps in `epoll_wait` on its listening sockets and its inbox's eventfd until a host
/// connects, a message comes or the next keep-alive tick is due.
pub(super) struct ListenerThread {
    shared: Arc<Shared>,
    listeners: Vec<(u16, TcpListener)>,
    inbox: Receiver<ListenMsg>,
    /// `None`: no epoll instance could be made; the thread naps [`LISTEN_NAP`] instead.
    epoll: Option<Epoll>,
    _waker: Arc<Waker>,
}

/// The nap of a listener thread without epoll between rounds that accepted nothing.
const LISTEN_NAP: Duration = Duration::from_millis(1);

impl ListenerThread {
    pub(super) fn new(
        shared: Arc<Shared>,
        listeners: Vec<(u16, TcpListener)>,
        inbox: Receiver<ListenMsg>,
        waker: Arc<Waker>,
    ) -> Self {
        let epoll = Epoll::new().and_then(|ep| {
            ep.add_edge(waker.fd())?;
            for (_, l) in &listeners {
                ep.add(l.as_raw_fd())?;
            }
            Ok(ep)
        });
        let epoll = epoll
            .map_err(|e| log::warn!("listener thread: epoll: {e}; napping instead"))
            .ok();
        ListenerThread {
            shared,
            listeners,
            inbox,
            epoll,
            _waker: waker,
        }
    }

    pub(super) fn run(mut self) {
        let mut next_id = 1u64;
        let mut last_tick = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            while let Ok(m) = self.inbox.try_recv() {
                match m {
                    ListenMsg::Add(portid, sock) => {
                        if let Some(ep) = &self.epoll {
                            if let Err(e) = ep.add(sock.as_raw_fd()) {
                                log::warn!("listener {portid}: epoll: {e}; napping instead");
                                self.epoll = None;
                            }
                        }
                        self.listeners.push((portid, sock));
                    }
                    // Closing the socket ends its watch.
                    ListenMsg::Remove(portid) => self.listeners.retain(|(p, _)| *p != portid),
                }
            }
            let accepted = self.accept(&mut next_id);
            if last_tick.elapsed() >= TICK {
                let now = Instant::now();
                last_tick = now;
                let mut target = self.shared.target();
                let mut close = Vec::new();
                for cntlid in target.tick(now) {
                    close.extend(target.drop_controller(cntlid));
                }
                // Reservation notices' events, raised by commands the workers ran.
                let aers = target.take_reservation_events();
                drop(target);
                self.shared.close_everywhere(close);
                self.shared.deliver(aers);
            }
            if !accepted {
                match &self.epoll {
                    Some(ep) => {
                        let next = TICK.saturating_sub(last_tick.elapsed());
                        // Rounded up: a wake just before the tick would find nothing to do.
                        let ms = next.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as i32;
                        ep.wait(ms);
                    }
                    None => std::thread::sleep(LISTEN_NAP),
                }
            }
        }
    }

    /// Accepts what the listeners have, each connection to the least loaded worker.
    fn accept(&self, next_id: &mut u64) -> bool {
        let mut any = false;
        for (portid, l) in &self.listeners {
            loop {
                match l.accept() {
                    Ok((s, peer)) => {
                        any = true;
                        if let Err(e) = s.set_nonblocking(true) {
                            log::warn!("{peer}: cannot make the socket non-blocking: {e}");
                            continue;
                        }
                        drop(s.set_nodelay(true));
                        let info = ConnInfo {
                            portid: *portid,
                            local_addr: s.local_addr().ok().map(|a| a.ip().to_string()),
                            peer: peer.to_string(),
                        };
                        let loads = &self.shared.loads;
                        let worker = (0..loads.len())
                            .min_by_key(|&i| loads[i].load(Ordering::Relaxed))
                            .unwrap_or(0);
                        log::debug!("{peer}: connected, to worker {worker}");
                        let id = *next_id;
                        *next_id += 1;
                        // Counted here so that the next accept sees it; the worker uncounts it.
                        loads[worker].fetch_add(1, Ordering::Relaxed);
                        self.shared.conns.accepted.fetch_add(1, Ordering::Relaxed);
                        self.shared.conns.active.fetch_add(1, Ordering::Relaxed);
                        if self.shared.inboxes[worker].send(Msg::Conn(id, s, info)).is_err() {
                            log::warn!("{peer}: worker {worker} has ended; connection dropped");
                            loads[worker].fetch_sub(1, Ordering::Relaxed);
                            self.shared.conns.active.fetch_sub(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        log::warn!("listener {portid}: accept: {e}");
                        break;
                    }
                }
            }
        }
        any
    }
}

/// Everything one worker thread owns.
pub(super) struct Worker {
    pub(super) index: usize,
    /// This worker's counters per subsystem, namespace and host (written by this thread only).
    pub(super) metrics: Arc<WorkerMetrics>,
    pub(super) shared: Arc<Shared>,
    pub(super) pool: DmaPool,
    pub(super) backends: Vec<Box<dyn Backend>>,
    /// Operations in flight per backend (same indices).
    pub(super) in_flight: Vec<Arc<AtomicU64>>,
    pub(super) ns: HashMap<(SubsystemId, u32), usize>,
    /// Backends of removed namespaces, dropped once nothing is in flight on them.
    pub(super) retiring: Vec<usize>,
    pub(super) inbox: Receiver<Msg>,
    pub(super) limits: TargetLimits,
    pub(super) spin: Duration,
    /// Where an idle worker sleeps until a socket has data or a backend a completion
    /// (`None`: it naps instead).
    pub(super) epoll: Option<Epoll>,
    /// Backend descriptors in `epoll`.
    pub(super) watched: std::collections::HashSet<std::os::fd::RawFd>,
    /// Keeps the DMA mappings alive as long as the pool.
    pub(super) _dma: DmaContext,
    /// The eventfd in `epoll` that messages and the stop signal.
    pub(super) _waker: Arc<Waker>,
}

impl Worker {
    /// Wraps `b` to count its operations in flight and adds it; returns its index.
    fn push_backend(&mut self, b: Box<dyn Backend>) -> usize {
        let n = Arc::new(AtomicU64::new(0));
        self.in_flight.push(n.clone());
        self.backends.push(Box::new(Counted {
            inner: b,
            in_flight: n,
        }));
        self.backends.len() - 1
    }

    /// Handles one message; connections opened go into `conns`, queues to close into `close`.
    fn message(&mut self, m: Msg, conns: &mut HashMap<u64, Conn>, close: &mut Vec<QueueRef>) {
        match m {
            Msg::Conn(id, s, info) => {
                let c = Conn::new(id, s, info, &self.limits, self.shared.stats[self.index].clone());
                if let Some(ep) = &self.epoll {
                    if let Err(e) = ep.add_keyed(c.fd(), CONN_KEY | id) {
                        log::warn!("worker {}: epoll: {e}; napping instead", self.index);
                        self.epoll = None;
                    }
                }
                conns.insert(id, c);
            }
            Msg::Close(q) => close.push(q),
            Msg::ClosePort(portid) => {
                for c in conns.values_mut().filter(|c| c.portid() == portid) {
                    c.close(&mut self.pool);
                }
            }
            Msg::Aer(a) => {
                let admin = QueueRef {
                    cntlid: a.cntlid,
                    qid: 0,
                };
                if let Some(c) = conns.values_mut().find(|c| c.queue() == Some(admin)) {
                    c.complete_held(a.cqe);
                }
            }
            Msg::AddBackend(id, nsid, b) => {
                let i = self.push_backend(b);
                if let Some(old) = self.ns.insert((id, nsid), i) {
                    self.retiring.push(old);
                }
            }
            Msg::RemoveBackend(id, nsid) => {
                if let Some(i) = self.ns.remove(&(id, nsid)) {
                    self.retiring.push(i);
                }
            }
        }
    }

    /// An idle round past the spin time: sleeps until a socket has data or, while backends
    /// have operations in flight, until one of them signals a completion (an NVMe queue pair
    /// in interrupt mode), at most [`SLEEP_MS`]. It naps for [`INFLIGHT_NAP`] instead when a
    /// backend with operations in flight has nothing to wait on (it is polled), a busy
    /// backend refused a submission, or a connection has answers waiting for room in its
    /// socket: a device that has not answered within the spin time is slow, and a core that
    /// keeps spinning on it takes the CPU from whatever shares it (on an emulated test bed,
    /// the emulated device itself). It does not sleep when a backend already has a
    /// completion.
    fn sleep(&mut self, conns: &HashMap<u64, Conn>, retry: &VecDeque<Submission>) {
        let Some(ep) = &self.epoll else {
            std::thread::sleep(NAP);
            return;
        };
        let mut nap = !retry.is_empty() || conns.values().any(Conn::busy);
        for (i, b) in self.backends.iter_mut().enumerate() {
            if nap || self.in_flight[i].load(Ordering::Relaxed) == 0 {
                continue;
            }
            match b.arm() {
                Ok(fd) if self.watched.insert(fd) => match ep.add_edge(fd) {
                    // Already watched: a descriptor number reused after a retired backend.
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => nap = true,
                    _ => {}
                },
                Ok(_) => {}
                Err(true) => return,
                Err(false) => nap = true,
            }
        }
        if nap {
            std::thread::sleep(INFLIGHT_NAP);
        } else if conns.values().any(Conn::throttled) {
            // Commands wait for a rate limit: its buckets hold 50 ms of credit, so a look
            // every millisecond keeps the rate, and the other connections of this worker keep
            // the spin-then-sleep they have without it (a nap after every idle round would
            // cost them their answers' latency).
            ep.wait(THROTTLED_SLEEP_MS);
        } else {
            ep.wait(SLEEP_MS);
        }
    }

    /// Drops the backends of removed namespaces that have nothing in flight.
    fn retire(&mut self) {
        let (backends, in_flight, watched) = (&mut self.backends, &self.in_flight, &mut self.watched);
        self.retiring.retain(|&i| {
            if in_flight[i].load(Ordering::Relaxed) != 0 {
                return true;
            }
            // Its descriptors close with it; numbers may come back for others.
            watched.clear();
            backends[i] = Box::new(Gone {
                done: VecDeque::new(),
            });
            false
        });
    }

    pub(super) fn run(mut self) {
        let shared = self.shared.clone();
        let index = self.index;
        for b in std::mem::take(&mut self.backends) {
            self.push_backend(b);
        }
        let mut conns: HashMap<u64, Conn> = HashMap::new();
        let mut retry: VecDeque<Submission> = VecDeque::new();
        let mut close: Vec<QueueRef> = Vec::new();
        let mut ended: Vec<QueueRef> = Vec::new();
        let mut done: Vec<Completion> = Vec::new();
        let mut ready: Vec<u64> = Vec::with_capacity(64);
        let mut idle = false;
        let mut last_work = Instant::now();
        while !shared.stop.load(Ordering::Acquire) {
            let mut progress = false;
            while let Ok(m) = self.inbox.try_recv() {
                progress = true;
                self.message(m, &mut conns, &mut close);
            }
            if !self.retiring.is_empty() {
                self.retire();
            }
            for b in self.backends.iter_mut() {
                b.poll(&mut |c| done.push(c));
            }
            for _ in 0..retry.len() {
                let Some(mut s) = retry.pop_front() else { break };
                let buf = s.buf.take();
                match self.backends[s.backend].submit(&mut self.pool, s.op.clone(), s.slba, s.nlb, buf, s.tag)
                {
                    Ok(()) => progress = true,
                    Err(busy) => {
                        s.buf = busy.buf;
                        retry.push_back(s);
                    }
                }
            }
            {
                let mut cx = Ctx {
                    target: &shared.target,
                    pool: &mut self.pool,
                    backends: &mut self.backends,
                    ns: &self.ns,
                    retry: &mut retry,
                    subsystem_stats: &|id| shared.subsystem_stats(index, id),
                    metrics: &self.metrics,
                    close: &mut ended,
                };
                for c in done.drain(..) {
                    progress = true;
                    let cid = (c.tag & 0xffff) as u16;
                    match conns.get_mut(&(c.tag >> 16)) {
                        Some(conn) => conn.complete(&mut cx, cid, c.status, c.buf),
                        None => {
                            if let Some(b) = c.buf {
                                cx.pool.free(b);
                            }
                        }
                    }
                }
                // One epoll_wait says which sockets have input: a round costs one system call
                // however many connections are quiet (without epoll, a read on each).
                let all = match &self.epoll {
                    Some(ep) => ep.ready(&mut ready).is_none(),
                    None => true,
                };
                for (id, conn) in conns.iter_mut() {
                    let readable = all || ready.contains(&(CONN_KEY | id));
                    progress |= conn.receive(&mut cx, readable);
                    progress |= conn.flush(cx.pool);
                }
            }
            for q in close.drain(..) {
                for conn in conns.values_mut() {
                    if conn.queue() == Some(q) {
                        conn.close(&mut self.pool);
                    }
                }
            }
            let before = conns.len();
            conns.retain(|_, c| {
                if !c.is_closed() {
                    return true;
                }
                c.close(&mut self.pool);
                c.forget_subsystem();
                if let Some(q) = c.queue() {
                    ended.extend(shared.target().disconnect(q));
                }
                false
            });
            if conns.len() != before {
                progress = true;
                let gone = (before - conns.len()) as u64;
                shared.loads[self.index].fetch_sub(gone, Ordering::Relaxed);
                shared.conns.active.fetch_sub(gone, Ordering::Relaxed);
            }
            // Queues that ended here may be carried by other workers' connections.
            shared.close_everywhere(ended.drain(..));
            if progress {
                idle = false;
                continue;
            }
            // An idle round: the clock says how long since the last work (an idle round may
            // cost several system calls, so counting rounds would say little).
            if !idle {
                idle = true;
                last_work = Instant::now();
            } else if last_work.elapsed() >= self.spin {
                self.sleep(&conns, &retry);
            }
            std::hint::spin_loop();
        }
        let n = conns.len() as u64;
        for (_, mut c) in conns.drain() {
            c.close(&mut self.pool);
            c.forget_subsystem();
            if let Some(q) = c.queue() {
                shared.target().disconnect(q);
            }
        }
        // Retried submissions never reached a backend: their buffers go back now.
        for sub in retry.drain(..) {
            if let Some(b) = sub.buf {
                self.pool.free(b);
            }
        }
        // Backends shut down cleanly: wait until the device is done with every buffer.
        let t = Instant::now();
        let pending = |f: &[Arc<AtomicU64>]| f.iter().map(|n| n.load(Ordering::Relaxed)).sum::<u64>();
        while pending(&self.in_flight) > 0 && t.elapsed() < DRAIN {
            for b in self.backends.iter_mut() {
                b.poll(&mut |c| done.push(c));
            }
            for c in done.drain(..) {
                if let Some(b) = c.buf {
                    self.pool.free(b);
                }
            }
            std::hint::spin_loop();
        }
        let left = pending(&self.in_flight);
        if left > 0 {
            // A device may still write into these buffers: never free that memory (the worker,
            // with its pool, backends and DMA mappings, is leaked below).
            log::error!(
                "worker {}: {left} backend operations still in flight after {DRAIN:?}; keeping their \
                 buffers",
                self.index
            );
        }
        // Connections handed over but not yet taken are closed by dropping their sockets.
        let mut pending = 0u64;
        while let Ok(m) = self.inbox.try_recv() {
            if let Msg::Conn(..) = m {
                pending += 1;
            }
        }
        shared.loads[self.index].fetch_sub(n + pending, Ordering::Relaxed);
        shared.conns.active.fetch_sub(n + pending, Ordering::Relaxed);
        if left > 0 {
            std::mem::forget(self);
        }
    }
}
