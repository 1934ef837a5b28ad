//! A plan judged before anything is written: each action against the tree as the plan's
//! earlier actions leave it, the workflow's limits and budget, the rate limit.
//!
//! Each root the plan writes into has its snapshot store checked (`snapshot::check_store`)
//! once here, since it must be usable before anything is written.

use super::{Bytes, SandboxWriteExecutor};
use crate::budget::{Usage, check_budget, check_rate};
use crate::catalog::{Effect, Operation};
use crate::confine::path::shown_path;
use crate::confine::root::not_a_directory;
use crate::confine::{ExtensionPolicy, RelPath, TargetKind};
use crate::hash::sha256_hex;
use crate::plan::{Action, check_payload, render};
use crate::policy::{Approval, check_content_size, check_found_kind, check_size, check_target};
use crate::reason::{ReasonCode, Refusal, Verdict};
use crate::sandbox::Sandbox;
use crate::snapshot::{MAX_SNAPSHOT_BYTES, Snapshotter};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// What validation found for an action that passed.
#[derive(Debug, Clone)]
pub(super) struct Prepared {
    pub(super) approval: Approval,
    /// Bytes that would be on disk (`None` for a directory).
    pub(super) bytes: Option<Bytes>,
    /// The checksum of what the target holds, when validation read it for a simulation.
    pub(super) before_checksum: Option<String>,
}

/// What validation carries from one action of the plan to the next.
struct Tally {
    /// The tree as the earlier actions would leave it.
    sketch: Sketch,
    /// What the workflow's earlier runs registered (its budget's use).
    registered: Verdict<Usage>,
    /// What the plan's actions judged so far would register.
    planned: Usage,
    /// Writes only the rate limit held back: they count against the budget of the
    /// actions after them, so a plan over both limits is told of the budget now rather
    /// than once its rate-limited part was sent again and written.
    held_back: Usage,
    /// The plan's writes counted against the rate limit so far, and in all.
    writes: u32,
    plan_writes: u32,
    /// The rate limiter's state, and the time it is judged at.
    tat: Verdict<f64>,
    now: chrono::DateTime<chrono::Utc>,
    /// Each root's verdict, judged once per plan and given to every action in it: still
    /// the directory opened at start, its snapshot store usable.
    roots_checked: std::collections::HashMap<usize, Verdict>,
}

/// What an action refused by a limit alone would leave: root, path, bytes.
type Left = (usize, RelPath, Option<Bytes>);

/// The virtual tree during validation: what earlier actions of the plan would leave.
#[derive(Debug, Clone)]
enum Virtual {
    /// A file, and its bytes when they were read (only where they matter).
    File(Option<Bytes>),
    Dir,
}

/// What the plan's earlier actions would leave, by root and path below it, as
/// validation goes through them.
#[derive(Debug, Default)]
struct Sketch {
    tree: HashMap<(usize, String), Virtual>,
    /// Bytes made for actions refused by a limit alone, kept for the actions after
    /// them; past the workflow's byte budget they are not kept (the plan is refused
    /// already), so that a plan of a thousand appends to large files never holds a
    /// thousand renderings.
    kept_refused: u64,
    /// The files whose bytes were not kept, and the code that refused the action that
    /// made them.
    unkept: HashMap<(usize, String), ReasonCode>,
}

impl Sketch {
    /// Refuses a target in root `ri` beneath a path an earlier action makes a file, as
    /// the disk would refuse it at run time, before anything of the plan is written; and
    /// an operation `op` that reads the target, of a file whose bytes were not kept: what
    /// it leaves is not judged on a guess, but refused with the earlier action's code.
    /// Gives the target's key.
    fn check(
        &self,
        ri: usize,
        rel: &RelPath,
        op: &Operation,
        path: &str,
    ) -> Result<(usize, String), Refusal> {
        let comps = rel.components();
        for d in 1..comps.len() {
            if let Some(Virtual::File(_)) = self.tree.get(&(ri, comps[..d].join("/"))) {
                return Err(not_a_directory(&comps[..d]));
            }
        }
        let key = (ri, rel.as_string());
        if let Some(code) = self.unkept.get(&key)
            && op.reads_target()
        {
            return Err(Refusal::new(
                *code,
                format!(
                    "not judged: an earlier action of the plan on '{path}' was refused ({code}), and what it would have written there is not kept"
                ),
            ));
        }
        Ok(key)
    }

    /// What an action leaves at `rel` in root `ri`: a file of `bytes`, or a folder when
    /// none; with the folders above it. Bytes made for an action `refused` by a limit
    /// alone are kept within the workflow's byte `budget`.
    fn leave(
        &mut self,
        (ri, rel): (usize, &RelPath),
        bytes: Option<Bytes>,
        refused: Option<ReasonCode>,
        actions: &[Action],
        budget: u64,
    ) {
        let comps = rel.components();
        for d in 1..comps.len() {
            self.tree.insert((ri, comps[..d].join("/")), Virtual::Dir);
        }
        let key = (ri, rel.as_string());
        let v = match (bytes, refused) {
            (None, _) => Virtual::Dir,
            (Some(b @ Bytes::Made(_)), Some(code)) => {
                self.kept_refused += b.of(actions).len() as u64;
                // Past the budget: the file is known to be there, its bytes not kept
                // (see `unkept`).
                if self.kept_refused <= budget {
                    Virtual::File(Some(b))
                } else {
                    self.unkept.insert(key.clone(), code);
                    Virtual::File(None)
                }
            }
            (Some(b), _) => Virtual::File(Some(b)),
        };
        if let Virtual::File(Some(_)) = v {
            self.unkept.remove(&key);
        }
        self.tree.insert(key, v);
    }
}

impl SandboxWriteExecutor<'_> {
    /// Validation of the whole plan against the tree as its earlier actions would leave
    /// it. Budgets and the rate limit are checked in simulation too; only real writes
    /// consume them. A file's current bytes are read only where the result depends on
    /// them (appends, transforms) or a simulation reports their checksum: the execution
    /// reads them again for the snapshot anyway.
    pub(super) fn validate(&self, executable: bool) -> Vec<Result<Prepared, Refusal>> {
        let sb = self.sb;
        let gctx = sb.governance_context();
        let mut t = Tally {
            sketch: Sketch::default(),
            registered: self.registered_usage(),
            planned: Usage::default(),
            held_back: Usage::default(),
            writes: 0,
            plan_writes: u32::try_from(
                self.plan
                    .actions
                    .iter()
                    .filter(|a| crate::catalog::is_sandbox_write_intent(&a.intent))
                    .count(),
            )
            .unwrap_or(u32::MAX),
            tat: self.rate_tat(),
            now: sb.clock.now(),
            roots_checked: std::collections::HashMap::new(),
        };
        let mut out = Vec::new();
        for (k, a) in self.plan.actions.iter().enumerate() {
            // An action refused by a limit alone (budget, rate) is otherwise sound: the
            // actions after it are judged on the tree as it would leave it, so that what
            // they are told is true of the plan, not of the plan without it (a 429 must
            // mean the plan runs once the wait is over).
            let mut only_limited: Option<Left> = None;
            let r = self.judge(k, a, executable, &gctx, &mut t, &mut only_limited);
            let left = match (&r, only_limited) {
                (Ok(p), _) => {
                    if let Some(b) = &p.bytes {
                        t.planned.artifacts += 1;
                        t.planned.bytes += b.of(&self.plan.actions).len() as u64;
                    }
                    let (ri, rel) = (p.approval.resolved.root_index, &p.approval.resolved.rel);
                    Some((ri, rel.clone(), p.bytes.clone()))
                }
                (Err(_), left) => left,
            };
            if let Some((ri, rel, bytes)) = left {
                let refused = r.as_ref().err().map(|refused| refused.reason_code);
                let (actions, budget) = (&self.plan.actions, sb.config.limits.max_workflow_bytes);
                t.sketch.leave((ri, &rel), bytes, refused, actions, budget);
            }
            out.push(r);
        }
        out
    }

    /// One action `a` (the `k`-th) judged against the tree the earlier ones leave
    /// (`t.sketch`): governance, payload, ids, the target as it would be found, what it
    /// would leave, its size, then the limits. Refused by a limit alone, what it would
    /// leave is set in `only_limited`.
    fn judge(
        &self,
        k: usize,
        a: &Action,
        executable: bool,
        gctx: &crate::policy::GovernanceContext<'_>,
        t: &mut Tally,
        only_limited: &mut Option<Left>,
    ) -> Verdict<Prepared> {
        let sb = self.sb;
        let approval = check_target(&self.request(a), gctx)?;
        check_payload(approval.op, a)?;
        let ids = (
            self.plan.workflow_id.as_str(),
            self.plan.parent_workflow_id(),
        );
        check_parents(sb, ids, a)?;
        let ri = approval.resolved.root_index;
        self.check_new_id(a, ri)?;
        // A root moved or removed since the start (a write there would be refused) is
        // named for each of its actions, as is an unusable store.
        t.roots_checked
            .entry(ri)
            .or_insert_with(|| {
                sb.root_in_place(ri)?;
                crate::snapshot::check_store(&sb.roots[ri], Some(&self.plan.workflow_id))
            })
            .clone()?;
        let key = t
            .sketch
            .check(ri, &approval.resolved.rel, approval.op, &a.path)?;
        // What an earlier action leaves is judged as `check_target` judged the disk: its
        // kind, then the size of content given whole, both before anything is read (a
        // simulation reads a file to report its checksum, which may fail).
        if let Some(v) = t.sketch.tree.get(&key) {
            check_found_kind(
                approval.op,
                &approval.resolved.rel,
                matches!(v, Virtual::Dir),
            )?;
        }
        check_content_size(&approval, a.content.as_deref(), &sb.config.extensions)?;
        let current = self.found_at(&t.sketch, &key, &approval, a, executable)?;
        let before = match &current {
            // Unread bytes do not change the result (render needs to know only that the
            // file exists).
            Some(Virtual::File(b)) => {
                Some(b.as_ref().map_or(&[][..], |b| b.of(&self.plan.actions)))
            }
            _ => None,
        };
        let rendered = leaves(&approval, a, before, &sb.config.extensions)?;
        let size = rendered.as_ref().map_or(0, |b| b.len() as u64);
        let bytes = rendered.map(|b| match b {
            Cow::Borrowed(_) => Bytes::Content(k),
            Cow::Owned(b) => Bytes::Made(Arc::new(b)),
        });
        if let Err(r) = self.check_limits(t, bytes.is_some(), size)? {
            *only_limited = Some((ri, approval.resolved.rel.clone(), bytes));
            return Err(r);
        }
        // Hashed last, and for a simulation only, which reports it: an action refused
        // above never needs it, and a real write hashes what it finds under the target's
        // lock.
        let before_checksum = match &current {
            Some(Virtual::File(Some(b))) if !executable => {
                Some(sha256_hex(b.of(&self.plan.actions)))
            }
            _ => None,
        };
        Ok(Prepared {
            approval,
            bytes,
            before_checksum,
        })
    }

    /// What an action finds at its target (`key` in `sketch`): what an earlier action
    /// of the plan leaves there, else what is on disk, its bytes read only where the
    /// result depends on them or a simulation reports their checksum. A file too large
    /// for the action is refused from its size before its bytes are read or hashed.
    fn found_at(
        &self,
        sketch: &Sketch,
        key: &(usize, String),
        approval: &Approval,
        a: &Action,
        executable: bool,
    ) -> Verdict<Option<Virtual>> {
        let rel = &approval.resolved.rel;
        Ok(match sketch.tree.get(key) {
            // As for a file on disk (a thousand appends past the limit of a large file an
            // earlier action makes would each copy and hash it).
            Some(v @ Virtual::File(Some(b))) => {
                check_existing_size(approval.op, a, rel, b.of(&self.plan.actions).len() as u64)?;
                Some(v.clone())
            }
            Some(v) => Some(v.clone()),
            None => match approval.target.kind {
                TargetKind::File { size, .. } => {
                    check_existing_size(approval.op, a, rel, size)?;
                    let needed = approval.op.reads_target()
                        || (!executable && size <= approval.op.max_size_bytes.unwrap_or(0));
                    Some(Virtual::File(if needed {
                        let ri = approval.resolved.root_index;
                        let read = self.sb.roots[ri].read_file(rel, MAX_SNAPSHOT_BYTES)?;
                        Some(Bytes::Made(Arc::new(read)))
                    } else {
                        None
                    }))
                }
                TargetKind::Directory => Some(Virtual::Dir),
                TargetKind::Missing => None,
            },
        })
    }

    /// The workflow's budget (for an action that leaves bytes, `makes_file`, of `size`)
    /// and the rate limit, counting what the plan's earlier actions take (`t`): the
    /// inner refusal is a limit's; the outer one, a log that could not be read to count.
    fn check_limits(&self, t: &mut Tally, makes_file: bool, size: u64) -> Verdict<Verdict> {
        let sb = self.sb;
        let wf = &self.plan.workflow_id;
        if makes_file {
            let asked = Usage {
                artifacts: t.planned.artifacts + t.held_back.artifacts,
                bytes: t.planned.bytes + t.held_back.bytes,
            };
            let registered = t.registered.clone()?;
            if let Err(r) = check_budget(wf, &sb.config.limits, registered, asked, size) {
                return Ok(Err(r));
            }
        }
        // Every write of the plan that gets this far counts, refused or not: the wait a
        // refusal names is for all of them, so trying the plan again after it never comes
        // too early, and a plan over the burst is named as such.
        t.writes += 1;
        let per_minute = sb.config.limits.writes_per_minute;
        let limited = check_rate(
            wf,
            per_minute,
            t.tat.clone()?,
            t.now,
            t.writes,
            t.plan_writes,
        );
        if limited.is_err() && makes_file {
            t.held_back.artifacts += 1;
            t.held_back.bytes += size;
        }
        Ok(limited)
    }

    /// Refuses an action id already used in the workflow: recorded on the trail, or with
    /// a snapshot folder in any root (an id whose snapshot was pruned or removed would
    /// let a rollback take the new write's snapshot for the old one's), or with
    /// something other than a folder where its snapshot is to be taken in its root `ri`.
    fn check_new_id(&self, a: &Action, ri: usize) -> Verdict {
        let wf = &self.plan.workflow_id;
        let ran = self.sb.audit.ran_action(wf, a.id()).map_err(|e| {
            let words = || {
                format!(
                    "the audit trail could not be read to check that action_id '{}' is new in workflow '{wf}': {e}",
                    a.id()
                )
            };
            crate::error::busy_or_failed(&e, words, words)
        })?;
        let mut used = None;
        for (i, root) in self.sb.roots.iter().enumerate() {
            match Snapshotter::place(root, wf, a.id()) {
                Ok(true) => {
                    used.get_or_insert(root.path());
                }
                Ok(false) => {}
                Err(r) if i == ri => return Err(r),
                Err(_) => {}
            }
        }
        if ran {
            return Err(crate::plan::action_id_used(a.id(), wf));
        }
        if let Some(root) = used {
            return Err(crate::plan::action_folder_in_the_way(a.id(), wf, root));
        }
        Ok(())
    }

    /// The rate limiter's state from the audit trail.
    pub(super) fn rate_tat(&self) -> Verdict<f64> {
        let wf = &self.plan.workflow_id;
        let now = crate::budget::epoch_seconds(self.sb.clock.now());
        self.sb
            .audit
            .rate_tat(wf, now)
            .map_err(|e| uncountable("audit log", "recent writes for the rate limit", wf, &e))
    }

    /// The workflow's artifacts and bytes in the registry.
    pub(super) fn registered_usage(&self) -> Verdict<Usage> {
        let wf = &self.plan.workflow_id;
        self.sb
            .registry
            .usage_by_workflow(wf)
            .map_err(|e| uncountable("artifact registry", "budget", wf, &e))
    }
}

/// A log that cannot be read to count a limit refuses the write, rather than counting
/// nothing and letting it through.
fn uncountable(log: &str, what: &str, workflow_id: &str, e: &std::io::Error) -> Refusal {
    let words =
        || format!("the {log} could not be read to count workflow '{workflow_id}''s {what}: {e}");
    crate::error::busy_or_failed(e, words, words)
}

/// What an action leaves at its target given what the target holds (`before`), refused
/// (`size_exceeded`) when larger than its operation allows. Validation and the write
/// under the target's lock both come by the bytes through it alone, so that a simulation
/// and a run cannot disagree on them.
pub(super) fn leaves<'a>(
    approval: &Approval,
    a: &'a Action,
    before: Option<&[u8]>,
    extensions: &ExtensionPolicy,
) -> Verdict<Option<Cow<'a, [u8]>>> {
    let bytes = render(approval.op, a, &approval.ext, before)?;
    check_size(
        approval,
        bytes.as_ref().map_or(0, |b| b.len() as u64),
        extensions,
    )?;
    Ok(bytes)
}

/// Refuses, from its size alone and before reading it, an existing file the action
/// could not handle: one too large to snapshot, or one whose result would exceed the
/// operation's limit (an append adds its content; a transform's result differs from the
/// file by exactly what its edits add and remove, each applying once or not at all).
pub(super) fn check_existing_size(
    op: &crate::catalog::Operation,
    a: &Action,
    rel: &RelPath,
    size: u64,
) -> Verdict {
    use crate::catalog::human_bytes;
    // By its path in the root, as every refusal names a target.
    let shown = shown_path(&rel.as_string());
    let too_big = |what: String| Err(Refusal::new(ReasonCode::SizeExceeded, what));
    if size > MAX_SNAPSHOT_BYTES {
        return too_big(format!(
            "{shown} holds {} and a snapshot holds at most {}, so it cannot be changed",
            human_bytes(size),
            human_bytes(MAX_SNAPSHOT_BYTES)
        ));
    }
    let Some(max) = op.max_size_bytes else {
        return Ok(());
    };
    match op.effect {
        Effect::Append => {
            let total = size.saturating_add(a.content.as_ref().map_or(0, |c| c.len() as u64));
            if total > max {
                return too_big(format!(
                    "{} would leave {total} bytes in {shown}; its limit is {max} bytes ({})",
                    op.name,
                    human_bytes(max)
                ));
            }
        }
        Effect::Edit => {
            let change: i128 = a
                .edits
                .iter()
                .flatten()
                .map(|e| e.new.len() as i128 - e.old.len() as i128)
                .sum();
            let total = i128::from(size) + change;
            if total > i128::from(max) {
                return too_big(format!(
                    "{} would leave {total} bytes in {shown}; its limit is {max} bytes ({})",
                    op.name,
                    human_bytes(max)
                ));
            }
        }
        // What they leave does not depend on what is there: the limit is checked on
        // what is rendered.
        Effect::Create
        | Effect::Replace
        | Effect::Write
        | Effect::Serialize(_)
        | Effect::Directory => {}
    }
    Ok(())
}

/// The lineage an action names must exist: its parent artifact in the registry, its
/// plan's parent workflow on the audit trail (recorded dangling, it led nowhere).
fn check_parents(
    sb: &Sandbox,
    (workflow_id, parent_workflow): (&str, Option<&str>),
    a: &Action,
) -> Verdict {
    if let Some(p) = &a.parent_artifact_id
        && sb.registry.get(p).ok().flatten().is_none()
    {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!("parent_artifact_id '{p}' is not a registered artifact"),
        ));
    }
    let Some(p) = parent_workflow else {
        return Ok(());
    };
    if p == workflow_id {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "parent_workflow_id '{p}' is the plan's own workflow_id: a workflow is not its own parent; name the workflow this one derives from, or leave it out"
            ),
        ));
    }
    // Refused plans do not count: one refused for this very lineage would make the
    // parent known to the same plan sent again.
    if !sb.audit.workflow_acted(p).unwrap_or(true) {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "parent_workflow_id '{p}' names no workflow the audit trail records doing anything (nothing was written, simulated or rolled back under it): name one that did, or leave it out"
            ),
        ));
    }
    Ok(())
}
