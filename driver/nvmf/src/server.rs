//! The target's runtime: listeners and the worker thread that polls every connection, the
//! namespaces' backends and the keep-alive timer.
//!
//! One worker owns everything (the [`Target`], the DMA buffer pool, the backends, the
//! connections): no lock on the command path. It polls without blocking and naps briefly when
//! a round found nothing to do, so an idle target costs little CPU.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, DmaError, DmaPool, PageSize};

use crate::backend::{Backend, Completion};
use crate::conn::{Conn, Ctx, Submission};
use crate::fabrics::{ConnInfo, QueueRef, SubsystemId, Target};
use crate::pdu::{LimitsError, TargetLimits};

/// How often the keep-alive timers advance ([`Target::tick`]; KAS is one second).
const TICK: Duration = Duration::from_secs(1);
/// Rounds without progress before the worker starts napping.
const SPIN_ROUNDS: u32 = 256;
/// The nap of an idle worker.
const NAP: Duration = Duration::from_micros(200);

/// A namespace's storage, named by its subsystem and NSID.
pub struct NamespaceBackend {
    /// The subsystem's NQN.
    pub subsystem_nqn: String,
    /// The namespace's NSID in it.
    pub nsid: u32,
    /// Where its blocks live.
    pub backend: Box<dyn Backend>,
}

/// What a [`Server`] serves and how.
pub struct ServerConfig {
    /// The subsystems, namespaces and listeners (each listener is bound; port 0 picks one).
    pub target: Target,
    /// One backend per namespace of the target's subsystems.
    pub namespaces: Vec<NamespaceBackend>,
    /// Where the data buffers come from.
    pub dma: DmaContext,
    /// Page size of the buffer pool's memory.
    pub page_size: PageSize,
    /// Data buffers of MDTS bytes each: commands moving data wait for one when all are out.
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
    /// The worker thread did not start.
    #[error("cannot start the worker thread: {0}")]
    Thread(#[source] io::Error),
}

/// Counters the worker keeps (read with [`Server::stats`]).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    accepted: AtomicU64,
    active: AtomicU64,
    commands: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    protocol_errors: AtomicU64,
}

impl Stats {
    pub(crate) fn add_command(&self) {
        self.commands.fetch_add(1, Ordering::Relaxed);
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
    /// Bytes sent to hosts as read data (I/O reads).
    pub read_bytes: u64,
    /// Bytes received from hosts after R2T.
    pub written_bytes: u64,
    /// Connections ended by a protocol error.
    pub protocol_errors: u64,
}

/// A running target: its listeners and worker thread. Dropping it stops it.
pub struct Server {
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    worker: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds the target's listeners, makes the buffer pool and starts the worker.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServerError> {
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
        let mut ns = HashMap::new();
        let mut backends = Vec::new();
        for n in cfg.namespaces {
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
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let worker = Worker {
            target: cfg.target,
            pool,
            backends,
            ns,
            listeners,
            limits,
            stop: stop.clone(),
            stats: stats.clone(),
            _dma: cfg.dma,
        };
        let handle = std::thread::Builder::new()
            .name("nvmf-worker".into())
            .spawn(move || worker.run())
            .map_err(ServerError::Thread)?;
        Ok(Server {
            addrs,
            stop,
            stats,
            worker: Some(handle),
        })
    }

    /// The addresses the listeners are bound to, in the target's listener order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            accepted: get(&s.accepted),
            active: get(&s.active),
            commands: get(&s.commands),
            read_bytes: get(&s.read_bytes),
            written_bytes: get(&s.written_bytes),
            protocol_errors: get(&s.protocol_errors),
        }
    }

    /// True while the worker runs.
    pub fn is_running(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| !w.is_finished())
    }

    /// Stops the worker (closing every connection) and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            if w.join().is_err() {
                log::error!("the NVMe/TCP worker panicked");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Everything the worker thread owns.
struct Worker {
    target: Target,
    pool: DmaPool,
    backends: Vec<Box<dyn Backend>>,
    ns: HashMap<(SubsystemId, u32), usize>,
    listeners: Vec<(u16, TcpListener)>,
    limits: TargetLimits,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    /// Keeps the DMA mappings alive as long as the pool.
    _dma: DmaContext,
}

impl Worker {
    fn run(mut self) {
        let mut conns: HashMap<u64, Conn> = HashMap::new();
        let mut next_id = 1u64;
        let mut retry: VecDeque<Submission> = VecDeque::new();
        let mut close: Vec<QueueRef> = Vec::new();
        let mut done: Vec<Completion> = Vec::new();
        let mut last_tick = Instant::now();
        let mut idle = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            let mut progress = self.accept(&mut conns, &mut next_id);
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
                    target: &mut self.target,
                    pool: &mut self.pool,
                    backends: &mut self.backends,
                    ns: &self.ns,
                    retry: &mut retry,
                    stats: &self.stats,
                    limits: &self.limits,
                    close: &mut close,
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
            if last_tick.elapsed() >= TICK {
                let now = Instant::now();
                last_tick = now;
                for cntlid in self.target.tick(now) {
                    close.extend(self.target.drop_controller(cntlid));
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
                    close.extend(self.target.disconnect(q));
                }
                false
            });
            if conns.len() != before {
                progress = true;
                self.stats.active.store(conns.len() as u64, Ordering::Relaxed);
            }
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
        for (_, mut c) in conns.drain() {
            c.close(&mut self.pool);
            if let Some(q) = c.queue() {
                self.target.disconnect(q);
            }
        }
        self.stats.active.store(0, Ordering::Relaxed);
    }

    /// Accepts what the listeners have.
    fn accept(&mut self, conns: &mut HashMap<u64, Conn>, next_id: &mut u64) -> bool {
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
                        log::debug!("{peer}: connected");
                        let id = *next_id;
                        *next_id += 1;
                        conns.insert(id, Conn::new(id, s, info, &self.limits));
                        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        self.stats.active.store(conns.len() as u64, Ordering::Relaxed);
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
