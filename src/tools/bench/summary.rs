//! What a `--model` run reports besides the rows: the modelled paths, the pattern, the summary
//! figures (efficiency, latency against one RDMA write, the trace digest).
#![forbid(unsafe_code)]

use crate::transport::modelfab::link;

/// NCCL's protocols as its network proxy posts them: the step is the connection buffer divided by
/// NCCL_STEPS = 8 (NCCL `src/include/device.h`: SIMPLE 4 MiB buffer, LL 8 lines × 512 threads × 8
/// steps × 16 B, LL128 120 elements × 640 threads × 8 steps × 8 B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// 512 KiB steps.
    Simple,
    /// 64 KiB steps.
    Ll,
    /// 600 KiB (614400 B) steps.
    Ll128,
    /// Whole messages, `--window` per timed batch (the bench's plain bandwidth mode).
    Messages,
}

impl Pattern {
    /// The largest send of the pattern; `None` for whole messages.
    pub fn step_bytes(self) -> Option<usize> {
        match self {
            Pattern::Simple => Some(512 * 1024),
            Pattern::Ll => Some(64 * 1024),
            Pattern::Ll128 => Some(614_400),
            Pattern::Messages => None,
        }
    }
}

/// One modelled path, for the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PathSummary {
    pub rate_gbits_s: f64,
    pub latency_us: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

/// The model part of a report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelSummary {
    pub spec: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pcie: String,
    pub paths: Vec<PathSummary>,
    /// Σ path rates, Gb/s.
    pub sum_gbits_s: f64,
    /// "RoCE v2 over IPv4, MTU 4096" or "payload only".
    pub framing: String,
    pub pattern: Pattern,
    /// Largest send (bandwidth), bytes; absent for whole messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_bytes: Option<usize>,
    /// Sends in flight (bandwidth).
    pub window: usize,
    /// Whether payloads were copied and checked.
    pub verify: bool,
    /// Efficiency at the largest size (absent in latency mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// One-way latency of `latency_bytes` messages through the protocol, us.
    pub latency_us: f64,
    pub latency_bytes: usize,
    /// The modelled one-way time of one RDMA write with immediate of `latency_bytes` on the fastest
    /// path (latency + wire time): the physical floor, us.
    pub rdma_write_us: f64,
    /// `latency_us / rdma_write_us`.
    pub latency_ratio: f64,
    /// Digest of the main run's event trace (equal on every machine for the same command).
    pub trace_hash: String,
    /// What the latency probe's messages cost on the fabric.
    pub counters: Counters,
    /// What each message of the main run cost on the fabric: bandwidth streamed as NCCL's proxy
    /// posts it (a step pattern), one size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<Counters>,
}

/// Work requests and packets per message of a ping-pong of `bytes`-byte messages, counted by the
/// model fabric: both ranks' work (a message's data and the clear-to-send of its receive).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Counters {
    /// Message size, bytes.
    pub bytes: usize,
    /// Messages the probe sent (pings and pongs).
    pub messages: u64,
    /// Per message, all paths.
    pub per_message: PerMessage,
    /// Per message, per path index.
    pub paths: Vec<PerMessage>,
}

/// Per-message averages of [`crate::transport::modelfab::PathStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PerMessage {
    pub work_requests: f64,
    pub imm_writes: f64,
    pub signaled: f64,
    /// Data packets.
    pub packets: f64,
    /// Acknowledgement packets.
    pub acks: f64,
}

impl Counters {
    /// Divides the fabric's per-path counts by `messages`.
    pub fn from_stats(
        bytes: usize,
        messages: u64,
        paths: &[crate::transport::modelfab::PathStats],
    ) -> Counters {
        let m = messages.max(1) as f64;
        let per = |p: &crate::transport::modelfab::PathStats| PerMessage {
            work_requests: p.work_requests as f64 / m,
            imm_writes: p.imm_writes as f64 / m,
            signaled: p.signaled as f64 / m,
            packets: p.packets as f64 / m,
            acks: p.acks as f64 / m,
        };
        let mut all = crate::transport::modelfab::PathStats::default();
        for p in paths {
            all.add(p);
        }
        Counters {
            bytes,
            messages,
            per_message: per(&all),
            paths: paths.iter().map(per).collect(),
        }
    }

    /// One report line: the totals, then per path.
    pub fn text(&self) -> String {
        let p = &self.per_message;
        let paths: Vec<String> = self
            .paths
            .iter()
            .enumerate()
            .map(|(k, x)| format!("p{k} {:.2}/{:.2}", x.work_requests, x.packets + x.acks))
            .collect();
        format!(
            "per {} B message ({} messages): {:.2} work requests ({:.2} with immediate, {:.2} \
             signaled), {:.2} packets ({:.2} data + {:.2} ACK); per path (work requests/packets): {}",
            self.bytes,
            self.messages,
            p.work_requests,
            p.imm_writes,
            p.signaled,
            p.packets + p.acks,
            p.packets,
            p.acks,
            paths.join(", ")
        )
    }
}

/// A one-line description of the model for table headers.
pub fn describe(m: &ModelSummary) -> String {
    let paths: Vec<String> = m
        .paths
        .iter()
        .map(|p| {
            let mut s = format!(
                "{}/{}",
                link::rate_text((p.rate_gbits_s * 1e9) as u64),
                link::ps_text((p.latency_us * 1e6) as u64)
            );
            if let Some(r) = &p.root {
                s.push_str(&format!("@{r}"));
            }
            s
        })
        .collect();
    format!(
        "{} paths [{}] = {:.2} Gb/s{}, {}",
        m.paths.len(),
        paths.join(", "),
        m.sum_gbits_s,
        if m.pcie.is_empty() {
            String::new()
        } else {
            format!(", PCIe {}", m.pcie)
        },
        m.framing
    )
}
