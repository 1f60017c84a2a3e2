//! `listen` and `accept`: the listener and its handle, then per hello the endpoint and the receive
//! comm, the reply, and the wait for the connector's `ready` and the endpoint's set-up. A step that
//! fails for one incoming connection drops that connection and goes back to waiting: only the
//! listener itself (or [`MAX_FAILED_CONNECTIONS`] authenticated connections in a row) fails `accept`.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;
use std::sync::{Arc, Weak};

use super::data::RecvEnd;
use super::live::Live;
use super::report::{
    ConnReport, FarEnd, SetupSteps, Step as SetupStep, accept_gdr_warning, gdr_scope, level_name,
    step_error,
};
use super::{ConnOptions, Connectable, PathFactory, PathPlan, Switchless};
use crate::error::{Error, Result};
use crate::plugin::{CommInfo, Handle};
use crate::route::handle::Handle as HandleView;
use crate::route::select::Reach;
use crate::route::types::LinkKind;
use crate::sync::lock;
use crate::transport::comm::RecvComm;
use crate::transport::handshake::{
    AcceptPoll, AcceptorView, Established, Incoming, Listener, Liveness, PathParams, SideParams,
};
use crate::transport::wire::CtrlInfo;

/// Authenticated incoming connections whose set-up may fail before `accept` itself fails. Only the
/// real connector (it holds the handle) gets this far, so repeated failures mean its set-up cannot
/// work, and NCCL is better told.
pub const MAX_FAILED_CONNECTIONS: usize = 8;

/// A receive comm over an endpoint with its liveness channel.
type LiveRecv<F> = RecvComm<Live<F>>;

/// A listening endpoint (`listenComm`). It holds the backend weakly: NCCL never closes the listen comm
/// of a connection that did not finish (abort, a lazy connect never made), and such a comm must not
/// keep the backend, its devices and its parked connections alive past the last `finalize`.
pub struct ListenEnd<P: PathFactory> {
    backend: Weak<Switchless<P>>,
    listener: Listener,
    dev: usize,
    comm: CommInfo,
    state: AcceptState<Live<P::Fabric>>,
    /// Incoming connections that failed after their hello checked out.
    failed: usize,
}

/// The reply is sent; the connector's `ready` is awaited.
struct Responding<F: Connectable> {
    inc: Incoming,
    comm: RecvComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
    steps: SetupSteps,
}

/// The handshake is done; the endpoint finishes its set-up ([`Connectable::poll_ready`]).
struct Finishing<F: Connectable> {
    comm: RecvComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
    remote: Vec<PathParams>,
    est: Established,
    steps: SetupSteps,
}

/// Where `accept` stands between NCCL's calls.
enum AcceptState<F: Connectable> {
    /// No hello yet.
    Waiting,
    Responding(Box<Responding<F>>),
    Finishing(Box<Finishing<F>>),
    /// The connection was handed to NCCL.
    Done,
    /// The listener failed (NCCL got its error).
    Failed,
}

/// Why a step failed: the one incoming connection, or the listener.
enum Failure {
    Connection(Error),
    Listener(Error),
}

impl<P: PathFactory> Switchless<P> {
    /// `listen`: binds the listener and writes the handle that advertises this node's links.
    pub(super) fn open_listener(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<ListenEnd<P>> {
        self.sweep_parked();
        let view = AcceptorView {
            links: self.view.links.clone(),
            routes: self.view.routes.clone(),
            reach: if self.view.config.tcp_fallback {
                Reach::Routed
            } else {
                Reach::OnLink
            },
            refuse_relayed: self.view.config.relay == crate::config::RelayMode::Off,
        };
        let control = self.control_addr();
        let listener = Listener::bind_advertised(view, control, self.timeout())?;
        let (repr, left_out) = listener.handle(control)?;
        if repr.links.is_empty() {
            return Err(Error::System(
                "listen: no local link is up; the listen handle would advertise no address".into(),
            ));
        }
        report_left_out(&left_out);
        handle.fill(0);
        repr.emit(&mut HandleView::new_unchecked(&mut handle[..]))?;
        Ok(ListenEnd {
            backend: Arc::downgrade(self),
            listener,
            dev,
            comm: *comm,
            state: AcceptState::Waiting,
            failed: 0,
        })
    }

    /// The control address the handle advertises: the first up TCP-only link (a management NIC).
    fn control_addr(&self) -> Option<Ipv4Addr> {
        self.view
            .links
            .iter()
            .find(|l| l.up && l.kind == LinkKind::Tcp)
            .map(|l| l.addr.addr())
    }

    /// Answers a hello whose paths the listener already checked: builds the receiving side and
    /// replies with its parameters, or rejects the hello with the reason.
    fn respond(
        &self,
        mut inc: Incoming,
        dev: usize,
        info: &CommInfo,
    ) -> Result<AcceptState<Live<P::Fabric>>> {
        let who = format!("connector {}", inc.peer());
        // From the hello: the paths were chosen by the connector and checked by the listener.
        let mut steps = SetupSteps::start();
        let plans: Vec<PathPlan> = inc
            .paths()
            .iter()
            .map(|p| PathPlan {
                local: p.local.clone(),
                remote: p.request.connector.addr(),
                kind: p.request.kind,
                // The relay host connects from its address on this link (`remote`); its name is
                // what the connector was told, this end knows only that address.
                relay: p.request.relayed.then(|| crate::transport::tcp::RelayVia {
                    name: p.request.connector.addr().to_string(),
                    chained: false,
                    dialer: None,
                }),
            })
            .collect();
        let peer: Vec<PathParams> = inc.paths().iter().map(|p| p.peer_params.clone()).collect();
        let opts = ConnOptions {
            secret: inc.fabric_secret(),
            ..self.opts(info, dev, true)
        };
        let standby = CtrlInfo::from_bytes(&inc.hello().params.extra).map_or(0, |c| c.standby);
        let peer_ip = format!("connector {}", inc.peer().ip());
        self.check_gdr_ends(dev, &plans, standby, &peer_ip)?;
        steps.lap(SetupStep::Route);
        match self.build_recv(&plans, &peer, &opts, &inc.hello().params.extra, &mut steps) {
            Ok((rc, local)) => {
                inc.respond(SideParams {
                    paths: local.clone(),
                    extra: rc.local_info().to_bytes(),
                })?;
                Ok(AcceptState::Responding(Box::new(Responding {
                    inc,
                    comm: rc,
                    plans,
                    local,
                    steps,
                })))
            }
            Err(e) => {
                // The connector holds the handle (its hello is authenticated): it may be told why.
                let reason = e.to_string();
                // Best effort: the connector then fails at once with the reason, not by timeout.
                if inc.reject(&reason).is_ok() {
                    let _ = inc.poll();
                }
                Err(step_error(e, &who, "setting up the accepted paths"))
            }
        }
    }

    /// `NCCL_NET_GDR_LEVEL` on the accepting side: NCCL decided GPU-direct for its device `dev`
    /// here (`paths.cc`), while the connector chose the paths from its own side's locality. When
    /// NCCL may put GPU memory on `dev`'s connections, the paths whose end on this node is farther
    /// from `dev` than the level allows are said in one WARN per peer, naming each cable and what
    /// the connection does with it ([`accept_gdr_warning`]). The connection goes on, as on the
    /// connecting side when only far links reach the peer: refusing it would fail NCCL's init
    /// where the far NIC still works (PCIe peer-to-peer through the host bridge).
    fn check_gdr_ends(&self, dev: usize, plans: &[PathPlan], standby: u8, who: &str) -> Result<()> {
        if !self.gpu_memory(dev) {
            return Ok(());
        }
        let Some(scope) = gdr_scope(self.view.config.net_gdr_level) else {
            return Ok(());
        };
        let Some(near) = self.near_links(dev, scope) else {
            return Ok(()); // the device has no PCI function to measure from
        };
        let far: Vec<FarEnd<'_>> = plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.kind == LinkKind::Roce && !near.iter().any(|n| n.id == p.local.id))
            .map(|(i, p)| FarEnd {
                index: i,
                standby: i < 8 && standby & (1 << i) != 0,
                link: &p.local,
                closeness: self.closeness_to(dev, &p.local.pci_root),
            })
            .collect();
        if far.is_empty() {
            return Ok(());
        }
        let first_time = lock(&self.warned_gdr, "GPU-direct warnings")
            .map(|mut w| w.insert(format!("accept {who}")))?;
        if first_time {
            tracing::warn!(
                "NET/switchless: {}",
                accept_gdr_warning(
                    &format!("accept from {who}"),
                    dev,
                    &self.dev_name(dev),
                    &level_name(self.view.config.net_gdr_level),
                    &far,
                )
            );
        }
        Ok(())
    }

    /// The receiving side of an accepted connection: the endpoint on `plans`, connected to the
    /// connector's `peer` parameters, and the receive comm with the connector's control info
    /// (`extra`) installed. Returns it with this side's parameters.
    fn build_recv(
        &self,
        plans: &[PathPlan],
        peer: &[PathParams],
        opts: &ConnOptions,
        extra: &[u8],
        steps: &mut SetupSteps,
    ) -> Result<(LiveRecv<P::Fabric>, Vec<PathParams>)> {
        let fab = self.factory.create(plans, Some(peer), opts)?;
        let mut rc = RecvComm::new(Live::new(fab), self.proto)?;
        rc.connect(CtrlInfo::from_bytes(extra)?)?;
        steps.lap(SetupStep::Qps);
        rc.fabric().connect_peer(peer, opts)?;
        steps.lap(SetupStep::RtrRts);
        let local = rc.fabric().local_params();
        Ok((rc, local))
    }
}

/// What one step of the accept state machine did.
enum Step<F: Connectable> {
    /// Moved to a new state: step that one at once.
    Next(AcceptState<F>),
    /// Waits in this state for the connector or the endpoint: NCCL calls `accept` again.
    Pending(AcceptState<F>),
    /// The connection is ready.
    Ready(RecvEnd<F>),
}

impl<P: PathFactory> ListenEnd<P> {
    /// `accept`: steps the connection as far as the sockets and the endpoint allow.
    pub(super) fn accept(&mut self) -> Result<Option<RecvEnd<Live<P::Fabric>>>> {
        if let Some(b) = self.backend.upgrade() {
            b.sweep_parked();
        }
        loop {
            // A step that fails leaves `Failed` behind; one incoming connection's failure is undone
            // below.
            let step = match std::mem::replace(&mut self.state, AcceptState::Failed) {
                AcceptState::Waiting => self.waiting(),
                AcceptState::Responding(r) => r.step().map_err(Failure::Connection),
                AcceptState::Finishing(f) => self.finishing(f).map_err(Failure::Connection),
                AcceptState::Done => {
                    self.state = AcceptState::Done;
                    return Err(Error::InvalidArgument(
                        "accept called again on a listen comm that already returned its connection"
                            .into(),
                    ));
                }
                AcceptState::Failed => {
                    return Err(Error::InvalidArgument(
                        "accept called again on a listen comm whose accept failed".into(),
                    ));
                }
            };
            match step {
                Ok(Step::Next(s)) => self.state = s,
                Ok(Step::Pending(s)) => {
                    self.state = s;
                    return Ok(None);
                }
                Ok(Step::Ready(end)) => {
                    self.state = AcceptState::Done;
                    return Ok(Some(end));
                }
                Err(Failure::Listener(e)) => return Err(e),
                Err(Failure::Connection(e)) => {
                    self.failed += 1;
                    if self.failed >= MAX_FAILED_CONNECTIONS {
                        return Err(e.context(format_args!(
                            "accept: {} authenticated connections failed in a row; the last",
                            self.failed
                        )));
                    }
                    // Its endpoint, comm and socket are gone with the state; wait for the next.
                    tracing::warn!(
                        "NET/switchless: accept: dropped an incoming connection ({} of at most {MAX_FAILED_CONNECTIONS}), waiting for another: {e}",
                        self.failed
                    );
                    self.state = AcceptState::Waiting;
                }
            }
        }
    }

    /// The backend, while a context or comm still holds it.
    fn backend(&self) -> Result<Arc<Switchless<P>>> {
        self.backend.upgrade().ok_or_else(|| {
            Error::InvalidUsage(
                "accept on a listen comm whose plugin was finalized (every context is gone)".into(),
            )
        })
    }

    /// `closeListen`: the listener and any connection in progress go; parked connects are swept.
    pub(super) fn close(self) {
        if let Some(b) = self.backend.upgrade() {
            b.sweep_parked();
        }
    }

    /// No hello yet: poll the listener, and respond to a hello.
    fn waiting(&mut self) -> std::result::Result<Step<Live<P::Fabric>>, Failure> {
        match self.listener.poll().map_err(Failure::Listener)? {
            None => Ok(Step::Pending(AcceptState::Waiting)),
            Some(inc) => self
                .backend()
                .map_err(Failure::Listener)?
                .respond(inc, self.dev, &self.comm)
                .map(Step::Next)
                .map_err(Failure::Connection),
        }
    }

    /// The handshake is done: poll the endpoint's set-up, then log the connection and hand it over.
    fn finishing(&self, mut f: Box<Finishing<Live<P::Fabric>>>) -> Result<Step<Live<P::Fabric>>> {
        let who = |est: &Established| format!("connector {}", est.peer.ip());
        let ready = f
            .comm
            .fabric_mut()
            .poll_ready()
            .map_err(|e| step_error(e, &who(&f.est), "connecting the data paths"))?;
        if !ready {
            return Ok(Step::Pending(AcceptState::Finishing(f)));
        }
        f.steps.lap(SetupStep::Ready);
        let Finishing {
            mut comm,
            plans,
            local,
            remote,
            est,
            steps,
        } = *f;
        let (peer, tcp) = (who(&est), format!("tcp {} <- {}", est.local, est.peer));
        let peer_ip = est.peer.ip().to_string();
        comm.fabric_mut().watch(Liveness::new(est)?);
        let b = self.backend()?;
        b.metrics
            .add(false, &peer_ip, self.dev, &plans, comm.metrics())?;
        b.log_connected(&ConnReport {
            verb: "accepted from",
            peer: &peer,
            dev: self.dev,
            plans: &plans,
            local: &local,
            remote: &remote,
            fab: comm.fabric(),
            tcp,
            steps: &steps,
        });
        Ok(Step::Ready(RecvEnd::new(comm)))
    }
}

impl<F: Connectable> Responding<F> {
    /// The reply is out: wait for the connector's `ready`.
    fn step(mut self: Box<Self>) -> Result<Step<F>> {
        Ok(match self.inc.poll()? {
            AcceptPoll::Pending => Step::Pending(AcceptState::Responding(self)),
            AcceptPoll::Done(est) => {
                let Responding {
                    inc,
                    comm,
                    plans,
                    local,
                    mut steps,
                } = *self;
                steps.lap(SetupStep::Handshake);
                let remote = inc.paths().iter().map(|p| p.peer_params.clone()).collect();
                Step::Next(AcceptState::Finishing(Box::new(Finishing {
                    comm,
                    plans,
                    local,
                    remote,
                    est,
                    steps,
                })))
            }
        })
    }
}

/// Links the listen handle had no room for, said once per process (every listen would repeat it):
/// a WARN naming each RoCE link left out (a peer reached only through it fails with "no shared
/// subnet", which looks like a cabling error), an INFO for TCP ones. `switchless doctor` reports
/// the same (`handle-links-over-limit`).
fn report_left_out(left_out: &[crate::route::types::LocalLink]) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    let up: Vec<&crate::route::types::LocalLink> = left_out.iter().filter(|l| l.up).collect();
    if up.is_empty() || SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let name = |l: &&crate::route::types::LocalLink| format!("{} {}", l.netdev, l.addr);
    let roce: Vec<String> = up
        .iter()
        .filter(|l| l.kind == crate::route::types::LinkKind::Roce)
        .map(name)
        .collect();
    let tcp: Vec<String> = up
        .iter()
        .filter(|l| l.kind != crate::route::types::LinkKind::Roce)
        .map(name)
        .collect();
    let max = crate::route::handle::MAX_LINKS;
    if !roce.is_empty() {
        tracing::warn!(
            "NET/switchless: the listen handle advertises at most {max} links (point-to-point RoCE \
             first); left out: RoCE {}{}. A peer reached only through those fails to connect \
             (\"no shared subnet\"); exclude storage and management NICs with NCCL_IB_HCA, or remove \
             secondary addresses (switchless doctor: handle-links-over-limit)",
            roce.join(", "),
            if tcp.is_empty() {
                String::new()
            } else {
                format!("; TCP {}", tcp.join(", "))
            }
        );
    } else {
        tracing::info!(
            "NET/switchless: the listen handle advertises at most {max} links; left out: TCP {}",
            tcp.join(", ")
        );
    }
}
