//! The target's runtime: the listener thread and the worker threads that poll connections, the
//! namespaces' backends and the keep-alive timer.
//!
//! One listener thread accepts connections and hands each to the worker with the fewest
//! connections; it also advances the keep-alive timers once a second. Each worker owns its
//! connections, its own backend instances (a vfpoll NVMe namespace needs one queue pair per
//! worker: SPDK's "one thread per queue pair") and its own DMA buffer pool, so the command path
//! takes no lock. The fabrics [`Target`] (Connect, admin commands, keep-alive) is shared behind a
//! mutex: admin commands are rare, and I/O decoding uses each queue's own `IoQueue`.
//!
//! A controller's admin and I/O queues may live on different workers: when one of them ends (a
//! disconnect, a reset, a keep-alive expiry), every worker gets a "close queue" message in its
//! inbox and closes the connection carrying that queue if it holds it. Workers poll without
//! blocking and nap briefly when a round found nothing to do, so an idle target costs little CPU.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaError, DmaPool, PageSize};

use crate::backend::{Backend, Completion};
use crate::conn::{Conn, Ctx, Submission};
use crate::fabrics::{ConnInfo, QueueRef, SubsystemId, Target};
use crate::pdu::{LimitsError, TargetLimits};

/// How often the keep-alive timers advance ([`Target::tick`]; KAS is one second).
const TICK: Duration = Duration::from_secs(1);
/// Rounds without progress before a worker starts napping.
const SPIN_ROUNDS: u32 = 256;
/// The nap of an idle worker.
const NAP: Duration = Duration::from_micros(200);
/// The nap of the listener thread between rounds that accepted nothing.
const LISTEN_NAP: Duration = Duration::from_millis(1);

/// A namespace's storage, named by its subsystem and NSID.
pub struct NamespaceBackend {
    /// The subsystem's NQN.
    pub subsystem_nqn: String,
    /// The namespace's NSID in it.
    pub nsid: u32,
    /// Where its blocks live.
    pub backend: Box<dyn Backend>,
}

/// A hook run first on a worker's thread (e.g. pinning it to a core); an error stops the start.
pub type WorkerStart = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// One worker thread: its own backend instances and what it runs first.
pub struct WorkerConfig {
    /// One backend per namespace of the target's subsystems, owned by this worker (RAM backends
    /// may share their storage; an NVMe namespace needs the worker's own queue pair).
    pub namespaces: Vec<NamespaceBackend>,
    /// Run on the worker's thread before it polls anything.
    pub on_start: Option<WorkerStart>,
}

impl WorkerConfig {
    /// A worker with these backends and no start hook.
    pub fn new(namespaces: Vec<NamespaceBackend>) -> Self {
        WorkerConfig {
            namespaces,
            on_start: None,
        }
    }
}

/// What a [`Server`] serves and how.
pub struct ServerConfig {
    /// The subsystems, namespaces and listeners (each listener is bound; port 0 picks one).
    pub target: Target,
    /// The workers, at least one; each new connection goes to the one with the fewest.
    pub workers: Vec<WorkerConfig>,
    /// Where the data buffers come from.
    pub dma: DmaContext,
    /// Page size of the buffer pools' memory.
    pub page_size: PageSize,
    /// Data buffers of MDTS bytes each, per worker: commands moving data wait for one when all
    /// are out.
    pub buffers: usize,
    /// MAXH2CDATA offered to hosts; in-capsule data follows the target's options.
    pub maxh2cdata: u32,
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener's address is not an IP address and port.
    #[error("listener {portid}: {traddr}:{trsvcid} is not an IP address and TCP port")]
    BadListener {
        /// Its port ID.
        portid: u16,
        /// Its address.
        traddr: String,
        /// Its service ID.
        trsvcid: String,
    },
    /// Binding a listener failed.
    #[error("cannot listen on {addr}: {source} (is another target using the port?)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A namespace backend names a subsystem the target does not have.
    #[error("a backend is given for subsystem {0}, which the target does not serve")]
    NoSuchSubsystem(String),
    /// The buffer pool could not be made.
    #[error("data buffers: {0}")]
    Pool(#[from] DmaError),
    /// MAXH2CDATA is not usable.
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// A thread did not start.
    #[error("cannot start a thread: {0}")]
    Thread(#[source] io::Error),
    /// No worker was given.
    #[error("a server needs at least one worker")]
    NoWorkers,
    /// A worker's start hook failed.
    #[error("worker {worker}: {reason}")]
    WorkerStart {
        /// The worker's index.
        worker: usize,
        /// What the hook said.
        reason: String,
    },
}

/// Counters the threads keep (read with [`Server::stats`]).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    accepted: AtomicU64,
    active: AtomicU64,
    commands: AtomicU64,
    io_commands: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    protocol_errors: AtomicU64,
}

impl Stats {
    pub(crate) fn add_command(&self) {
        self.commands.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_io_command(&self) {
        self.io_commands.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_read(&self, n: u64) {
        self.read_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_written(&self, n: u64) {
        self.written_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_protocol_error(&self) {
        self.protocol_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open now.
    pub active: u64,
    /// Command capsules received.
    pub commands: u64,
    /// Of those, commands on I/O queues.
    pub io_commands: u64,
    /// Bytes sent to hosts as read data (I/O reads).
    pub read_bytes: u64,
    /// Bytes received from hosts after R2T.
    pub written_bytes: u64,
    /// Connections ended by a protocol error.
    pub protocol_errors: u64,
}

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

/// What the listener sends a worker.
enum Msg {
    /// A new connection, its ID and where it came from.
    Conn(u64, TcpStream, ConnInfo),
    /// Close the connection carrying this queue, if this worker has it.
    Close(QueueRef),
}

/// What the threads share.
struct Shared {
    target: Mutex<Target>,
    inboxes: Vec<Sender<Msg>>,
    /// Connections per worker, for the listener's choice.
    loads: Vec<AtomicU64>,
    stop: AtomicBool,
    stats: Stats,
}

impl Shared {
    fn target(&self) -> MutexGuard<'_, Target> {
        // A worker that panicked holding the lock left the target as consistent as any
        // single admin command leaves it; the others go on.
        self.target.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells every worker to close these queues' connections.
    fn close_everywhere(&self, queues: impl IntoIterator<Item = QueueRef>) {
        for q in queues {
            for tx in &self.inboxes {
                // A worker that has ended holds no connection.
                drop(tx.send(Msg::Close(q)));
            }
        }
    }
}

/// A running target: its listener and worker threads. Dropping it stops it.
pub struct Server {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds the target's listeners, makes each worker's buffer pool and starts the threads.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServerError> {
        if cfg.workers.is_empty() {
            return Err(ServerError::NoWorkers);
        }
        let opts = *cfg.target.options();
        let limits = TargetLimits::new(cfg.maxh2cdata, opts.in_capsule_data)?;
        if opts.max_transfer < 8192 {
            // MDTS 0 means "no limit" (NVMe Base 2.0, Identify Controller MDTS): hosts may send
            // larger commands, which are refused with Invalid Field.
            log::warn!(
                "max_transfer {} B is reported as MDTS 0 (no limit); hosts other than test clients \
                 need at least 8 KiB",
                opts.max_transfer
            );
        }
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for l in cfg.target.listeners() {
            let bad = || ServerError::BadListener {
                portid: l.portid,
                traddr: l.traddr.clone(),
                trsvcid: l.trsvcid.clone(),
            };
            let ip: IpAddr = l.traddr.parse().map_err(|_| bad())?;
            let port: u16 = l.trsvcid.parse().map_err(|_| bad())?;
            let addr = SocketAddr::new(ip, port);
            let sock = TcpListener::bind(addr).map_err(|source| ServerError::Bind { addr, source })?;
            sock.set_nonblocking(true)
                .map_err(|source| ServerError::Bind { addr, source })?;
            addrs.push(sock.local_addr().unwrap_or(addr));
            listeners.push((l.portid, sock));
        }
        let mut workers = Vec::new();
        let mut inboxes = Vec::new();
        for w in cfg.workers {
            let mut ns = HashMap::new();
            let mut backends = Vec::new();
            for n in w.namespaces {
                let id = cfg
                    .target
                    .subsystem_id(&n.subsystem_nqn)
                    .ok_or_else(|| ServerError::NoSuchSubsystem(n.subsystem_nqn.clone()))?;
                ns.insert((id, n.nsid), backends.len());
                backends.push(n.backend);
            }
            let pool = cfg
                .dma
                .pool(opts.max_transfer as usize, cfg.buffers.max(1), cfg.page_size)?;
            let (tx, rx) = mpsc::channel();
            inboxes.push(tx);
            workers.push((w.on_start, pool, backends, ns, rx));
        }
        let shared = Arc::new(Shared {
            target: Mutex::new(cfg.target),
            loads: inboxes.iter().map(|_| AtomicU64::new(0)).collect(),
            inboxes,
            stop: AtomicBool::new(false),
            stats: Stats::default(),
        });
        let mut server = Server {
            addrs,
            shared: shared.clone(),
            threads: Vec::new(),
        };
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<(), String>)>();
        for (index, (on_start, pool, backends, ns, inbox)) in workers.into_iter().enumerate() {
            let worker = Worker {
                index,
                shared: shared.clone(),
                pool,
                backends,
                ns,
                inbox,
                limits,
                _dma: cfg.dma.clone(),
            };
            let ready = ready_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("nvmf-worker{index}"))
                .spawn(move || {
                    let started = on_start.map_or(Ok(()), |f| f());
                    let ok = started.is_ok();
                    drop(ready.send((index, started)));
                    if ok {
                        worker.run();
                    }
                })
                .map_err(ServerError::Thread)?;
            server.threads.push(handle);
        }
        drop(ready_tx);
        for _ in 0..server.threads.len() {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((worker, Err(reason))) => return Err(ServerError::WorkerStart { worker, reason }),
                Err(_) => {
                    return Err(ServerError::WorkerStart {
                        worker: 0,
                        reason: "a worker ended before it started".into(),
                    })
                }
            }
        }
        let listener = ListenerThread {
            shared: shared.clone(),
            listeners,
        };
        let handle = std::thread::Builder::new()
            .name("nvmf-listener".into())
            .spawn(move || listener.run())
            .map_err(ServerError::Thread)?;
        server.threads.push(handle);
        Ok(server)
    }

    /// The addresses the listeners are bound to, in the target's listener order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// How many worker threads poll connections.
    pub fn workers(&self) -> usize {
        self.shared.inboxes.len()
    }

    /// Connections open now on each worker.
    pub fn worker_connections(&self) -> Vec<u64> {
        self.shared
            .loads
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .collect()
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.shared.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            accepted: get(&s.accepted),
            active: get(&s.active),
            commands: get(&s.commands),
            io_commands: get(&s.io_commands),
            read_bytes: get(&s.read_bytes),
            written_bytes: get(&s.written_bytes),
            protocol_errors: get(&s.protocol_errors),
        }
    }

    /// True while the listener and every worker run.
    pub fn is_running(&self) -> bool {
        !self.threads.is_empty() && self.threads.iter().all(|t| !t.is_finished())
    }

    /// Stops the threads (closing every connection) and waits for them.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // The listener (last) first, so that no connection is handed to a worker that ended.
        for t in self.threads.drain(..).rev() {
            if t.join().is_err() {
                log::error!("an NVMe/TCP target thread panicked");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The listener thread: accepts connections, hands them out, advances the keep-alive timers.
struct ListenerThread {
    shared: Arc<Shared>,
    listeners: Vec<(u16, TcpListener)>,
}

impl ListenerThread {
    fn run(self) {
        let mut next_id = 1u64;
        let mut last_tick = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            let accepted = self.accept(&mut next_id);
            if last_tick.elapsed() >= TICK {
                let now = Instant::now();
                last_tick = now;
                let mut target = self.shared.target();
                let mut close = Vec::new();
                for cntlid in target.tick(now) {
                    close.extend(target.drop_controller(cntlid));
                }
                drop(target);
                self.shared.close_everywhere(close);
            }
            if !accepted {
                std::thread::sleep(LISTEN_NAP);
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
                        self.shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        self.shared.stats.active.fetch_add(1, Ordering::Relaxed);
                        if self.shared.inboxes[worker].send(Msg::Conn(id, s, info)).is_err() {
                            log::warn!("{peer}: worker {worker} has ended; connection dropped");
                            loads[worker].fetch_sub(1, Ordering::Relaxed);
                            self.shared.stats.active.fetch_sub(1, Ordering::Relaxed);
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
struct Worker {
    index: usize,
    shared: Arc<Shared>,
    pool: DmaPool,
    backends: Vec<Box<dyn Backend>>,
    ns: HashMap<(SubsystemId, u32), usize>,
    inbox: Receiver<Msg>,
    limits: TargetLimits,
    /// Keeps the DMA mappings alive as long as the pool.
    _dma: DmaContext,
}

impl Worker {
    fn run(mut self) {
        let shared = self.shared.clone();
        let in_flight: Vec<Arc<AtomicU64>> = self.backends.iter().map(|_| Arc::default()).collect();
        self.backends = std::mem::take(&mut self.backends)
            .into_iter()
            .zip(&in_flight)
            .map(|(inner, n)| {
                Box::new(Counted {
                    inner,
                    in_flight: n.clone(),
                }) as Box<dyn Backend>
            })
            .collect();
        let mut conns: HashMap<u64, Conn> = HashMap::new();
        let mut retry: VecDeque<Submission> = VecDeque::new();
        let mut close: Vec<QueueRef> = Vec::new();
        let mut ended: Vec<QueueRef> = Vec::new();
        let mut done: Vec<Completion> = Vec::new();
        let mut idle = 0u32;
        while !shared.stop.load(Ordering::Acquire) {
            let mut progress = false;
            while let Ok(m) = self.inbox.try_recv() {
                progress = true;
                match m {
                    Msg::Conn(id, s, info) => {
                        conns.insert(id, Conn::new(id, s, info, &self.limits));
                    }
                    Msg::Close(q) => close.push(q),
                }
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
                    stats: &shared.stats,
                    limits: &self.limits,
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
                for conn in conns.values_mut() {
                    progress |= conn.receive(&mut cx);
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
                if let Some(q) = c.queue() {
                    ended.extend(shared.target().disconnect(q));
                }
                false
            });
            if conns.len() != before {
                progress = true;
                let gone = (before - conns.len()) as u64;
                shared.loads[self.index].fetch_sub(gone, Ordering::Relaxed);
                shared.stats.active.fetch_sub(gone, Ordering::Relaxed);
            }
            // Queues that ended here may be carried by other workers' connections.
            shared.close_everywhere(ended.drain(..));
            if progress {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle > SPIN_ROUNDS {
                    std::thread::sleep(NAP);
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let n = conns.len() as u64;
        for (_, mut c) in conns.drain() {
            c.close(&mut self.pool);
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
        while pending(&in_flight) > 0 && t.elapsed() < DRAIN {
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
        let left = pending(&in_flight);
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
        shared.stats.active.fetch_sub(n + pending, Ordering::Relaxed);
        if left > 0 {
            std::mem::forget(self);
        }
    }
}
