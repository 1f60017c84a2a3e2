//! `listen` and `accept`: the listener and its handle, then per hello the endpoint and the receive
//! comm, the reply, and the wait for the connector's `ready` and the endpoint's set-up.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;
use std::sync::Arc;

use super::data::RecvEnd;
use super::report::{ConnReport, step_error};
use super::{Connectable, PathFactory, PathPlan, Switchless};
use crate::error::{Error, Result};
use crate::plugin::{CommInfo, Handle};
use crate::route::handle::Handle as HandleView;
use crate::route::select::Reach;
use crate::route::types::LinkKind;
use crate::transport::comm::RecvComm;
use crate::transport::handshake::{
    AcceptPoll, AcceptorView, Established, Incoming, Listener, PathParams, SideParams,
};
use crate::transport::wire::CtrlInfo;

/// A listening endpoint (`listenComm`).
pub struct ListenEnd<P: PathFactory> {
    backend: Arc<Switchless<P>>,
    listener: Listener,
    dev: usize,
    comm: CommInfo,
    state: AcceptState<P::Fabric>,
}

struct Responding<F: Connectable> {
    inc: Incoming,
    comm: RecvComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
}

/// The handshake is done; the endpoint finishes its set-up ([`Connectable::poll_ready`]).
struct Finishing<F: Connectable> {
    comm: RecvComm<F>,
    plans: Vec<PathPlan>,
    local: Vec<PathParams>,
    remote: Vec<PathParams>,
    est: Established,
}

enum AcceptState<F: Connectable> {
    Waiting,
    Responding(Box<Responding<F>>),
    Finishing(Box<Finishing<F>>),
    Done,
    Failed,
}

impl<P: PathFactory> Switchless<P> {
    /// `listen`: binds the listener and writes the handle that advertises this node's links.
    pub(super) fn open_listener(
        self: &Arc<Self>,
        comm: &CommInfo,
        dev: usize,
        handle: &mut Handle,
    ) -> Result<ListenEnd<P>> {
        let view = AcceptorView {
            links: self.view.links.clone(),
            routes: self.view.routes.clone(),
            reach: if self.view.config.tcp_fallback {
                Reach::Routed
            } else {
                Reach::OnLink
            },
        };
        let listener = Listener::bind_any(view, self.timeout())?;
        let (repr, left_out) = listener.handle(self.control_addr())?;
        if repr.links.is_empty() {
            return Err(Error::System(
                "listen: no local link is up; the listen handle would advertise no address".into(),
            ));
        }
        for l in left_out.iter().filter(|l| l.up) {
            tracing::info!(
                "NET/switchless: listen handle has no room for {} {} (at most 16 links are advertised)",
                l.netdev,
                l.addr
            );
        }
        handle.fill(0);
        repr.emit(&mut HandleView::new_unchecked(&mut handle[..]))?;
        Ok(ListenEnd {
            backend: Arc::clone(self),
            listener,
            dev,
            comm: *comm,
            state: AcceptState::Waiting,
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

    fn respond(
        &self,
        mut inc: Incoming,
        dev: usize,
        info: &CommInfo,
    ) -> Result<AcceptState<P::Fabric>> {
        let who = format!("connector {}", inc.peer());
        let plans: Vec<PathPlan> = inc
            .paths()
            .iter()
            .map(|p| PathPlan {
                local: p.local.clone(),
                remote: p.request.connector.addr(),
                kind: p.request.kind,
            })
            .collect();
        let peer: Vec<PathParams> = inc.paths().iter().map(|p| p.peer_params.clone()).collect();
        let opts = self.opts(info, dev, true);
        let built = (|| -> Result<(RecvComm<P::Fabric>, Vec<PathParams>)> {
            let fab = self.factory.create(&plans, Some(&peer), &opts)?;
            let mut rc = RecvComm::new(fab, self.proto)?;
            rc.connect(CtrlInfo::from_bytes(&inc.hello().params.extra)?)?;
            rc.fabric().connect_peer(&peer, &opts)?;
            let local = rc.fabric().local_params();
            Ok((rc, local))
        })();
        match built {
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
                })))
            }
            Err(e) => {
                let reason = e.to_string();
                if inc.reject(&reason).is_ok() {
                    let _ = inc.poll();
                }
                Err(step_error(e, &who, "setting up the accepted paths"))
            }
        }
    }
}

impl<P: PathFactory> ListenEnd<P> {
    /// `accept`: advances the connection as far as the sockets and the endpoint allow.
    pub(super) fn accept(&mut self) -> Result<Option<RecvEnd<P::Fabric>>> {
        loop {
            match std::mem::replace(&mut self.state, AcceptState::Failed) {
                AcceptState::Waiting => match self.listener.poll()? {
                    None => {
                        self.state = AcceptState::Waiting;
                        return Ok(None);
                    }
                    Some(inc) => self.state = self.backend.respond(inc, self.dev, &self.comm)?,
                },
                AcceptState::Responding(mut r) => match r.inc.poll()? {
                    AcceptPoll::Pending => {
                        self.state = AcceptState::Responding(r);
                        return Ok(None);
                    }
                    AcceptPoll::Done(est) => {
                        let Responding {
                            inc,
                            comm,
                            plans,
                            local,
                        } = *r;
                        let remote: Vec<PathParams> =
                            inc.paths().iter().map(|p| p.peer_params.clone()).collect();
                        self.state = AcceptState::Finishing(Box::new(Finishing {
                            comm,
                            plans,
                            local,
                            remote,
                            est,
                        }));
                    }
                },
                AcceptState::Finishing(mut f) => {
                    let ready = f.comm.fabric_mut().poll_ready().map_err(|e| {
                        step_error(
                            e,
                            &format!("connector {}", f.est.peer.ip()),
                            "connecting the data paths",
                        )
                    })?;
                    if !ready {
                        self.state = AcceptState::Finishing(f);
                        return Ok(None);
                    }
                    {
                        let Finishing {
                            comm,
                            plans,
                            local,
                            remote,
                            est,
                        } = *f;
                        self.backend.log_connected(&ConnReport {
                            verb: "accepted from",
                            peer: &format!("connector {}", est.peer.ip()),
                            dev: self.dev,
                            plans: &plans,
                            local: &local,
                            remote: &remote,
                            fab: comm.fabric(),
                            tcp: format!("tcp {} <- {}", est.local, est.peer),
                        });
                        self.state = AcceptState::Done;
                        return Ok(Some(RecvEnd::new(comm)));
                    }
                }
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
            }
        }
    }
}
