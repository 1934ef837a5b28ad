//! The seven Prometheus metrics of SPEC §9, in an explicit registry (no globals) that a
//! server face exposes as text.

use crate::reason::ReasonCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

wire_enum! {
    /// Why a rollback ran, the `reason` label of `ailab_sandbox_rollbacks_total`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RollbackReason {
        /// Asked for by hand (CLI, HTTP, MCP, library).
        Manual = "manual",
        /// An action failed and its own change was undone.
        ActionFailed = "action_failed",
        /// An action failed and the plan's earlier actions were undone.
        WorkflowFailed = "workflow_failed",
        /// Run at start-up for a run that died.
        Recovery = "recovery",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeResult {
    r#type: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IntentReason {
    intent: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Detection {
    detection_method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: String,
}

type HistogramFamily = Family<TypeLabel, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 100 µs to ~3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// The runtime's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    mutations: Family<TypeResult, Counter>,
    rollbacks: Family<Reason, Counter>,
    policy_denied: Family<IntentReason, Counter>,
    artifacts: Gauge,
    escape_attempts: Family<Detection, Counter>,
    checksum_mismatch: Counter,
    duration: HistogramFamily,
}

/// Intent label values are bounded (see [`crate::catalog::intent_label`]).
fn intent_label(intent: &str) -> String {
    crate::catalog::intent_label(intent).to_owned()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mutations = Family::<TypeResult, Counter>::default();
        let rollbacks = Family::<Reason, Counter>::default();
        let policy_denied = Family::<IntentReason, Counter>::default();
        let artifacts = Gauge::default();
        let escape_attempts = Family::<Detection, Counter>::default();
        let checksum_mismatch = Counter::default();
        let duration: HistogramFamily = Family::new_with_constructor(duration_histogram);
        registry.register(
            "ailab_sandbox_mutations",
            "Sandbox mutations by intent and result",
            mutations.clone(),
        );
        registry.register(
            "ailab_sandbox_rollbacks",
            "Rollbacks that restored at least one step, by reason",
            rollbacks.clone(),
        );
        registry.register(
            "ailab_sandbox_policy_denied",
            "Actions refused, by intent and reason code (governance, budgets, rate limit, checks made again at write time); failed writes are in ailab_sandbox_mutations_total with result failed",
            policy_denied.clone(),
        );
        registry.register(
            // A gauge gets no suffix from the encoder; SPEC §9 names it with `_total`.
            "ailab_sandbox_artifacts_total",
            "Artifacts in the registry",
            artifacts.clone(),
        );
        registry.register(
            "ailab_sandbox_escape_attempts",
            "Attempts to reach outside a sandbox root",
            escape_attempts.clone(),
        );
        registry.register(
            "ailab_sandbox_checksum_mismatch",
            "Checksums that did not match: a restore that hashed wrong, or a snapshot found damaged by a rollback asked for (each time)",
            checksum_mismatch.clone(),
        );
        registry.register(
            "ailab_sandbox_mutation_duration_seconds",
            "Time to execute one mutation",
            duration.clone(),
        );
        // The series an alert watches exist from the start, at 0: `increase()` over a
        // series that first appears at 1 sees no increase, so the first escape attempt
        // or rollback would go unnoticed.
        for reason in RollbackReason::ALL {
            drop(rollbacks.get_or_create(&Reason {
                reason: reason.as_str().to_owned(),
            }));
        }
        for code in ReasonCode::ALL
            .into_iter()
            .filter(|c| c.is_escape_attempt())
        {
            drop(escape_attempts.get_or_create(&Detection {
                detection_method: code.as_str().to_owned(),
            }));
        }
        Self {
            registry,
            mutations,
            rollbacks,
            policy_denied,
            artifacts,
            escape_attempts,
            checksum_mismatch,
            duration,
        }
    }

    /// Counts a mutation outcome (`success`, `failed`, `blocked`, `simulated`,
    /// `rolled_back`: what became of an action).
    pub fn mutation(&self, intent: &str, result: crate::executor::ActionStatus) {
        self.mutations
            .get_or_create(&TypeResult {
                r#type: intent_label(intent),
                result: result.as_str().to_owned(),
            })
            .inc();
    }

    /// Records how long a mutation took.
    pub fn mutation_duration(&self, intent: &str, seconds: f64) {
        self.duration
            .get_or_create(&TypeLabel {
                r#type: intent_label(intent),
            })
            .observe(seconds);
    }

    /// Counts a governance denial, and an escape attempt when `escape` (see
    /// [`crate::reason::Refusal::is_escape_attempt`]).
    pub fn denied(&self, intent: &str, code: ReasonCode, escape: bool) {
        self.policy_denied
            .get_or_create(&IntentReason {
                intent: intent_label(intent),
                reason: code.as_str().to_owned(),
            })
            .inc();
        if escape {
            self.escape_attempts
                .get_or_create(&Detection {
                    detection_method: code.as_str().to_owned(),
                })
                .inc();
        }
    }

    /// Counts a rollback.
    pub fn rollback(&self, reason: RollbackReason) {
        self.rollbacks
            .get_or_create(&Reason {
                reason: reason.as_str().to_owned(),
            })
            .inc();
    }

    /// Counts `n` snapshots a rollback found damaged (a backup whose bytes are not those
    /// recorded, a record whose seal does not match), or restores whose checksum did not
    /// match.
    pub fn checksum_mismatches(&self, n: usize) {
        self.checksum_mismatch.inc_by(n as u64);
    }

    /// Sets the artifact gauge.
    pub fn set_artifacts(&self, n: u64) {
        self.artifacts.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `openmetrics` (as [`Metrics::encode`] writes it) in Prometheus's classic text format
/// (version 0.0.4), for scrapers that do not ask for OpenMetrics: a counter family is
/// named there with its `_total` suffix, as its samples are (read as OpenMetrics by such
/// a parser, each counter would lose its type), `unknown` is `untyped`, and there is
/// no `# UNIT`, `_created` sample or `# EOF`.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        let family = |prefix: &str| {
            line.strip_prefix(prefix)
                .and_then(|rest| rest.split_once(' '))
        };
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some((name, rest)) = family("# HELP ").or_else(|| family("# TYPE ")) {
            let kind = &line[..7];
            let rest = if kind == "# TYPE " && rest == "unknown" {
                "untyped"
            } else {
                rest
            };
            let suffix = if counters.contains(name) {
                "_total"
            } else {
                ""
            };
            out.push_str(&format!("{kind}{name}{suffix} {rest}\n"));
            continue;
        }
        let sample = line.split(['{', ' ']).next().unwrap_or_default();
        if sample
            .strip_suffix("_created")
            .is_some_and(|f| counters.contains(f))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
