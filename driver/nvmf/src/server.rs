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
//! blocking; a worker that found nothing to do for [`ServerConfig::spin`] sleeps in `epoll_wait`
//! on its sockets until a host sends something (it keeps polling while its backends have
//! commands in flight), so an idle target costs no CPU and a busy one answers without a wake-up.
//! Messages to a sleeping thread (a new connection, a close, an event, the stop) come with a
//! write to its eventfd, and the listener thread sleeps in `epoll_wait` on its listening sockets
//! until a host connects or the next keep-alive tick: nothing wakes on a timer more than once a
//! second.
//!
//! A running server can be changed: listeners added and removed (the connections that came
//! through a removed one are closed), namespaces added (with one backend per worker) and
//! removed (their backends are dropped once their commands are done), hosts allowed or barred.
//! Each change raises the asynchronous events the fabrics layer reports, and the held
//! Asynchronous Event Requests complete on their controllers' admin connections.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use vfpoll_dma::{DmaContext, DmaError, PageSize};

use crate::backend::Backend;
use crate::fabrics::{
    AerCompletion, AnaState, ConnInfo, Listener, NamespaceInfo, QueueRef, Subsystem, SubsystemId, Target,
};
use crate::pdu::{LimitsError, TargetLimits};
use crate::sys::{Epoll, Waker};

pub(crate) mod metrics;
mod worker;

pub(crate) use metrics::{ConnTotals, Stats, WorkerMetrics};
pub use metrics::{HostStats, IoStats, Metrics, StatsSnapshot, SubsystemMetrics, LATENCY_BUCKETS_US};
use worker::{ListenerThread, Worker};

/// How often the keep-alive timers advance ([`Target::tick`]; KAS is one second).
const TICK: Duration = Duration::from_secs(1);
/// The nap of an idle worker.
const NAP: Duration = Duration::from_micros(200);
/// The default of [`ServerConfig::spin`].
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

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
    /// How long a worker keeps polling after its last work before it sleeps ([`DEFAULT_SPIN`]):
    /// then it waits in `epoll_wait` until one of its sockets has data (unless a backend has
    /// commands in flight: their completions are polled). Longer answers a host
    /// that pauses between commands without a wake-up; shorter leaves the core to others
    /// sooner. `Duration::MAX`: never sleep.
    pub spin: Duration,
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
    /// The eventfd or epoll instance a thread sleeps on could not be made.
    #[error("cannot make an eventfd for a thread's wake-ups: {0} (is the process out of file descriptors? raise `ulimit -n`)")]
    Wakeup(#[source] io::Error),
    /// No worker was given.
    #[error("a server needs at least one worker")]
    NoWorkers,
    /// A change the target refused.
    #[error(transparent)]
    Config(#[from] crate::fabrics::ConfigError),
    /// A namespace added at run time came with the wrong number of backends.
    #[error(
        "namespace {nsid} of {subsystem}: {given} backends given for {workers} workers: give one per worker"
    )]
    Backends {
        /// The subsystem's NQN.
        subsystem: String,
        /// The namespace ID.
        nsid: u32,
        /// Backends given.
        given: usize,
        /// Workers running.
        workers: usize,
    },
    /// The server has stopped.
    #[error("the target has stopped")]
    Stopped,
    /// A worker's start hook failed.
    #[error("worker {worker}: {reason}")]
    WorkerStart {
        /// The worker's index.
        worker: usize,
        /// What the hook said.
        reason: String,
    },
}

/// What a worker is told.
enum Msg {
    /// A new connection, its ID and where it came from.
    Conn(u64, TcpStream, ConnInfo),
    /// Close the connection carrying this queue, if this worker has it.
    Close(QueueRef),
    /// Close every connection that came through this listener (it was removed).
    ClosePort(u16),
    /// Send this completion of a held Asynchronous Event Request on the controller's admin
    /// queue, if this worker carries it.
    Aer(AerCompletion),
    /// Serve a namespace added at run time with this backend.
    AddBackend(SubsystemId, u32, Box<dyn Backend>),
    /// Drop a removed namespace's backend once its commands are done.
    RemoveBackend(SubsystemId, u32),
}

/// What the listener thread is told.
enum ListenMsg {
    /// Accept on this socket too, for listener `portid`.
    Add(u16, TcpListener),
    /// Stop accepting for listener `portid`.
    Remove(u16),
}

/// A thread's inbox: a message, then a wake-up of the thread if it sleeps in `epoll_wait`.
struct Mailbox<T> {
    tx: Sender<T>,
    waker: Arc<Waker>,
}

impl<T> Mailbox<T> {
    /// A mailbox and the receiving end; the receiver watches `waker`.
    fn new(waker: Arc<Waker>) -> (Mailbox<T>, Receiver<T>) {
        let (tx, rx) = mpsc::channel();
        (Mailbox { tx, waker }, rx)
    }

    fn send(&self, m: T) -> Result<(), mpsc::SendError<T>> {
        self.tx.send(m)?;
        self.waker.wake();
        Ok(())
    }
}

/// What the threads share.
struct Shared {
    target: Mutex<Target>,
    inboxes: Vec<Mailbox<Msg>>,
    listen: Mutex<Mailbox<ListenMsg>>,
    /// Connections per worker, for the listener's choice.
    loads: Vec<AtomicU64>,
    stop: AtomicBool,
    /// Each worker's counters.
    stats: Vec<Arc<Stats>>,
    /// Connections of the whole target.
    conns: ConnTotals,
    /// Each worker's counters per subsystem; a connection takes its subsystem's at Connect.
    subsystems: Vec<Mutex<HashMap<SubsystemId, Arc<Stats>>>>,
    /// Each worker's counters per subsystem, namespace and host.
    metrics: Vec<Arc<WorkerMetrics>>,
}

impl Shared {
    fn target(&self) -> MutexGuard<'_, Target> {
        // A worker that panicked holding the lock left the target as consistent as any
        // single admin command leaves it; the others go on.
        self.target.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn send_all(&self, m: impl Fn() -> Msg) {
        for tx in &self.inboxes {
            // A worker that has ended holds no connection.
            drop(tx.send(m()));
        }
    }

    /// Tells every worker to close these queues' connections.
    fn close_everywhere(&self, queues: impl IntoIterator<Item = QueueRef>) {
        for q in queues {
            self.send_all(|| Msg::Close(q));
        }
    }

    /// Sends held Asynchronous Event Request completions to the workers (the one carrying the
    /// controller's admin queue answers).
    fn deliver(&self, aers: impl IntoIterator<Item = AerCompletion>) {
        for a in aers {
            self.send_all(|| Msg::Aer(a));
        }
    }

    /// The operators' counters now, summed over the workers.
    fn metrics(&self) -> Metrics {
        let (names, auth_failures): (_, Vec<_>) = {
            let t = self.target();
            (
                t.subsystems()
                    .map(|(id, s)| (id, (s.nqn.clone(), t.refused_connects(id))))
                    .collect(),
                t.subsystems()
                    .map(|(id, s)| (s.nqn.clone(), t.auth_failures(id)))
                    .collect(),
            )
        };
        let st = self.stats();
        let mut m = metrics::collect(&self.metrics, &names, st.active, st.protocol_errors);
        for (nqn, n) in auth_failures {
            if let Some(s) = m.subsystems.get_mut(&nqn) {
                s.authentication_failures = n;
            }
        }
        m
    }

    /// Worker `worker`'s counters of subsystem `id` (made on first use).
    pub(crate) fn subsystem_stats(&self, worker: usize, id: SubsystemId) -> Arc<Stats> {
        let mut m = self.subsystems[worker]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        m.entry(id).or_default().clone()
    }

    /// Subsystem `id`'s counters, summed over the workers.
    fn subsystem_snapshot(&self, id: SubsystemId) -> StatsSnapshot {
        let mut s = StatsSnapshot::default();
        for w in &self.subsystems {
            if let Some(st) = w.lock().unwrap_or_else(PoisonError::into_inner).get(&id) {
                st.add_to(&mut s);
            }
        }
        s
    }

    /// The whole target's counters.
    fn stats(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot::default();
        for w in &self.stats {
            w.add_to(&mut s);
        }
        s.accepted = self.conns.accepted.load(Ordering::Relaxed);
        s.active = self.conns.active.load(Ordering::Relaxed);
        s
    }
}

/// Reads a server's [`Metrics`] from any thread ([`Server::metrics_handle`]).
#[derive(Clone)]
pub struct MetricsHandle(Arc<Shared>);

impl MetricsHandle {
    /// The counters now.
    pub fn metrics(&self) -> Metrics {
        self.0.metrics()
    }
}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsHandle")
    }
}

/// A running target: its listener and worker threads. Dropping it stops it.
pub struct Server {
    addrs: Mutex<Vec<(u16, SocketAddr)>>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// The ID of subsystem `nqn` of `target`.
fn subsystem_of(target: &Target, nqn: &str) -> Result<SubsystemId, ServerError> {
    target
        .subsystem_id(nqn)
        .ok_or_else(|| ServerError::NoSuchSubsystem(nqn.to_owned()))
}

/// Binds listener `l`, non-blocking.
fn bind(l: &Listener) -> Result<(TcpListener, SocketAddr), ServerError> {
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
    let local = sock.local_addr().unwrap_or(addr);
    Ok((sock, local))
}

impl Server {
    /// Binds the target's listeners, makes each worker's buffer pool and starts the threads.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServerError> {
        if cfg.workers.is_empty() {
            return Err(ServerError::NoWorkers);
        }
        let opts = *cfg.target.options();
        let limits = TargetLimits::new(cfg.maxh2cdata, opts.in_capsule_data)?;
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for l in cfg.target.listeners() {
            let (sock, local) = bind(l)?;
            addrs.push((l.portid, local));
            listeners.push((l.portid, sock));
        }
        let mut workers = Vec::new();
        let mut inboxes = Vec::new();
        for w in cfg.workers {
            let mut ns = HashMap::new();
            let mut backends = Vec::new();
            for n in w.namespaces {
                let id = subsystem_of(&cfg.target, &n.subsystem_nqn)?;
                ns.insert((id, n.nsid), backends.len());
                backends.push(n.backend);
            }
            let pool = cfg
                .dma
                .pool(opts.max_transfer as usize, cfg.buffers.max(1), cfg.page_size)?;
            let waker = Arc::new(Waker::new().map_err(ServerError::Wakeup)?);
            let (tx, rx) = Mailbox::new(waker.clone());
            inboxes.push(tx);
            workers.push((w.on_start, pool, backends, ns, rx, waker));
        }
        let listen_waker = Arc::new(Waker::new().map_err(ServerError::Wakeup)?);
        let (listen_tx, listen_rx) = Mailbox::new(listen_waker.clone());
        let shared = Arc::new(Shared {
            target: Mutex::new(cfg.target),
            loads: inboxes.iter().map(|_| AtomicU64::new(0)).collect(),
            inboxes,
            listen: Mutex::new(listen_tx),
            stop: AtomicBool::new(false),
            stats: workers.iter().map(|_| Arc::default()).collect(),
            conns: ConnTotals::default(),
            subsystems: workers.iter().map(|_| Mutex::default()).collect(),
            metrics: workers.iter().map(|_| Arc::default()).collect(),
        });
        let mut server = Server {
            addrs: Mutex::new(addrs),
            shared: shared.clone(),
            threads: Vec::new(),
        };
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<(), String>)>();
        for (index, (on_start, pool, backends, ns, inbox, waker)) in workers.into_iter().enumerate() {
            let worker = Worker {
                index,
                metrics: shared.metrics[index].clone(),
                shared: shared.clone(),
                pool,
                backends,
                in_flight: Vec::new(),
                ns,
                retiring: Vec::new(),
                inbox,
                limits,
                spin: cfg.spin,
                epoll: Epoll::new()
                    .and_then(|ep| ep.add_edge(waker.fd()).map(|()| ep))
                    .ok(),
                _waker: waker,
                watched: std::collections::HashSet::new(),
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
        let listener = ListenerThread::new(shared.clone(), listeners, listen_rx, listen_waker);
        let handle = std::thread::Builder::new()
            .name("nvmf-listener".into())
            .spawn(move || listener.run())
            .map_err(ServerError::Thread)?;
        server.threads.push(handle);
        Ok(server)
    }

    /// The addresses the listeners are bound to, in the order they were added.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listener_addrs().into_iter().map(|(_, a)| a).collect()
    }

    /// The listeners' port IDs and the addresses they are bound to.
    pub fn listener_addrs(&self) -> Vec<(u16, SocketAddr)> {
        self.addrs.lock().unwrap_or_else(PoisonError::into_inner).clone()
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

    /// The counters of the whole target now.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats()
    }

    /// The counters of each subsystem now, by NQN, in the target's order (the discovery
    /// subsystem's connections count only in [`Server::stats`]).
    pub fn subsystem_stats(&self) -> Vec<(String, StatsSnapshot)> {
        let names: Vec<(SubsystemId, String)> = self
            .shared
            .target()
            .subsystems()
            .map(|(id, s)| (id, s.nqn.clone()))
            .collect();
        names
            .into_iter()
            .map(|(id, nqn)| (nqn, self.shared.subsystem_snapshot(id)))
            .collect()
    }

    /// The operators' counters now: per subsystem, namespace and host, summed over the
    /// workers ([`Metrics::to_prometheus`] renders them).
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics()
    }

    /// A handle that reads [`Server::metrics`] from another thread (e.g. an HTTP server's)
    /// for as long as the server runs; after it stops the handle reads the last counters.
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle(self.shared.clone())
    }

    /// Runs `f` on the target (e.g. to read its controllers or subsystems).
    pub fn with_target<T>(&self, f: impl FnOnce(&Target) -> T) -> T {
        f(&self.shared.target())
    }

    /// Adds a listener at run time: binds it, names it in the discovery log (raising the
    /// discovery change event) and accepts on it. Returns the address it is bound to.
    pub fn add_listener(&self, l: Listener) -> Result<SocketAddr, ServerError> {
        self.check_running()?;
        let (sock, local) = bind(&l)?;
        let aers = self.shared.target().add_listener(l.clone())?;
        let sent = self
            .shared
            .listen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(ListenMsg::Add(l.portid, sock));
        if sent.is_err() {
            return Err(ServerError::Stopped);
        }
        self.addrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((l.portid, local));
        self.shared.deliver(aers);
        Ok(local)
    }

    /// Removes listener `portid` at run time: it accepts no more, the discovery log stops
    /// naming it (a discovery change event), and the connections that came through it are
    /// closed, as when a port of Linux's target is removed. A host with another path goes on
    /// there (multipath).
    pub fn remove_listener(&self, portid: u16) -> Result<(), ServerError> {
        self.check_running()?;
        let aers = self.shared.target().remove_listener(portid)?;
        drop(
            self.shared
                .listen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .send(ListenMsg::Remove(portid)),
        );
        self.addrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(p, _)| *p != portid);
        self.shared.send_all(|| Msg::ClosePort(portid));
        self.shared.deliver(aers);
        Ok(())
    }

    /// Adds namespace `info` to subsystem `nqn` at run time, served by `backends` (one per
    /// worker, in worker order); hosts get a Namespace Attribute Changed event.
    pub fn add_namespace(
        &self,
        nqn: &str,
        info: NamespaceInfo,
        backends: Vec<Box<dyn Backend>>,
    ) -> Result<(), ServerError> {
        self.check_running()?;
        if backends.len() != self.workers() {
            return Err(ServerError::Backends {
                subsystem: nqn.to_owned(),
                nsid: info.nsid,
                given: backends.len(),
                workers: self.workers(),
            });
        }
        let mut target = self.shared.target();
        let id = subsystem_of(&target, nqn)?;
        if target
            .subsystem(id)
            .is_some_and(|s| s.namespaces.iter().any(|n| n.nsid == info.nsid))
        {
            return Err(crate::fabrics::ConfigError::BadNamespace {
                subsystem: nqn.to_owned(),
                nsid: info.nsid,
                why: "the subsystem has that NSID already: remove it first or choose another".into(),
            }
            .into());
        }
        // The backends first: a host hears of the namespace only once every worker serves it.
        let nsid = info.nsid;
        for (tx, b) in self.shared.inboxes.iter().zip(backends) {
            drop(tx.send(Msg::AddBackend(id, nsid, b)));
        }
        let aers = match target.add_namespace(id, info) {
            Ok(a) => a,
            Err(e) => {
                drop(target);
                self.shared.send_all(|| Msg::RemoveBackend(id, nsid));
                return Err(e.into());
            }
        };
        drop(target);
        self.shared.deliver(aers);
        Ok(())
    }

    /// Removes namespace `nsid` from subsystem `nqn` at run time: new commands to it fail with
    /// Invalid Namespace, hosts get a Namespace Attribute Changed event, and each worker drops
    /// its backend once the commands it has in flight are done.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), ServerError> {
        self.check_running()?;
        let mut target = self.shared.target();
        let id = subsystem_of(&target, nqn)?;
        let aers = target.remove_namespace(id, nsid)?;
        drop(target);
        self.shared.send_all(|| Msg::RemoveBackend(id, nsid));
        self.shared.deliver(aers);
        Ok(())
    }

    /// Adds subsystem `sub` at run time with its namespaces, each served by the backends given
    /// for its NSID (one per worker, in worker order); discovery controllers hear of it.
    pub fn add_subsystem(
        &self,
        sub: Subsystem,
        mut backends: HashMap<u32, Vec<Box<dyn Backend>>>,
    ) -> Result<(), ServerError> {
        self.check_running()?;
        for ns in &sub.namespaces {
            let given = backends.get(&ns.nsid).map_or(0, Vec::len);
            if given != self.workers() {
                return Err(ServerError::Backends {
                    subsystem: sub.nqn.clone(),
                    nsid: ns.nsid,
                    given,
                    workers: self.workers(),
                });
            }
        }
        let nsids: Vec<u32> = sub.namespaces.iter().map(|n| n.nsid).collect();
        let mut target = self.shared.target();
        let (id, aers) = target.add_subsystem(sub)?;
        // Sent while the target is locked: a host can connect only after this, and a worker
        // takes its messages before it reads the commands of a round.
        for nsid in nsids {
            let per_worker = backends.remove(&nsid).unwrap_or_default();
            for (tx, b) in self.shared.inboxes.iter().zip(per_worker) {
                drop(tx.send(Msg::AddBackend(id, nsid, b)));
            }
        }
        drop(target);
        self.shared.deliver(aers);
        Ok(())
    }

    /// Removes subsystem `nqn` at run time: its controllers end (their connections are
    /// closed), its backends are dropped once their commands are done, and discovery
    /// controllers hear of it.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<(), ServerError> {
        self.check_running()?;
        let mut target = self.shared.target();
        let id = subsystem_of(&target, nqn)?;
        let nsids: Vec<u32> = target
            .subsystem(id)
            .map(|s| s.namespaces.iter().map(|n| n.nsid).collect())
            .unwrap_or_default();
        let (queues, aers) = target.remove_subsystem(id)?;
        drop(target);
        self.shared.close_everywhere(queues);
        for nsid in nsids {
            self.shared.send_all(|| Msg::RemoveBackend(id, nsid));
        }
        self.shared.deliver(aers);
        Ok(())
    }

    /// Sets the ANA state of group `group` on listener `portid` (NVMe Base 2.0 §8.1.3): hosts
    /// connected through it get an ANA Change notice and read the new state; I/O on an
    /// inaccessible path fails with a path error, so a multipath host sends it over another.
    pub fn set_ana_state(&self, portid: u16, group: u32, state: AnaState) -> Result<(), ServerError> {
        self.check_running()?;
        let aers = self.shared.target().set_ana_state(portid, group, state)?;
        self.shared.deliver(aers);
        Ok(())
    }

    /// Sets which hosts may connect to subsystem `nqn` (`None`: any host). Controllers already
    /// connected stay; new Connects are checked against the new list.
    pub fn set_allowed_hosts(&self, nqn: &str, hosts: Option<Vec<String>>) -> Result<(), ServerError> {
        self.check_running()?;
        let mut target = self.shared.target();
        let id = subsystem_of(&target, nqn)?;
        let aers = target.set_allowed_hosts(id, hosts)?;
        drop(target);
        self.shared.deliver(aers);
        Ok(())
    }

    /// Sets which hosts of subsystem `nqn` must authenticate with DH-HMAC-CHAP, with their
    /// secrets, at run time: Connects from now on use them.
    pub fn set_host_auth(
        &self,
        nqn: &str,
        hosts: std::collections::BTreeMap<String, Arc<crate::auth::HostAuth>>,
    ) -> Result<(), ServerError> {
        self.check_running()?;
        let mut target = self.shared.target();
        let id = subsystem_of(&target, nqn)?;
        target.set_host_auth(id, hosts)?;
        Ok(())
    }

    /// Sets subsystem `nqn`'s rate limits per host and per namespace at run time: queues
    /// apply them from their next command; a limit that stays keeps its credit.
    pub fn set_limits(&self, nqn: &str, limits: crate::fabrics::Limits) -> Result<(), ServerError> {
        self.check_running()?;
        let mut target = self.shared.target();
        let id = subsystem_of(&target, nqn)?;
        target.set_limits(id, limits)?;
        Ok(())
    }

    fn check_running(&self) -> Result<(), ServerError> {
        if self.shared.stop.load(Ordering::Acquire) || !self.is_running() {
            return Err(ServerError::Stopped);
        }
        Ok(())
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
        // Sleepers see the flag now, not at their next timeout.
        for m in &self.shared.inboxes {
            m.waker.wake();
        }
        self.shared
            .listen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waker
            .wake();
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
