//! What a start says of the runs it recovered: the notices `state` shows.

use super::Recovered;
use crate::sandbox::{Sandbox, counted};

impl Sandbox {
    /// The notices of one recovery: what was done, or why it is not done and what comes
    /// next. They reach clients (a server's state), so no path outside the roots is named.
    pub(crate) fn recovery_notices(&self, r: &Recovered) -> Vec<String> {
        if r.unreadable_record {
            let mut out = vec![unreadable_record(r)];
            out.extend(left_for_the_operator(r));
            return out;
        }
        if let Some(left) = not_settled(r) {
            return vec![left];
        }
        let mut out = vec![if r.rollback {
            rollback_settled(r)
        } else {
            run_settled(r)
        }];
        out.extend(left_for_the_operator(r));
        out.extend(unlisted(r));
        if r.untrusted > 0 {
            out.push(self.untrusted(r));
        }
        out
    }

    /// Snapshot folders left alone, named where they lie (inside the roots).
    fn untrusted(&self, r: &Recovered) -> String {
        format!(
            "recovery of {} (workflow {}) left {} alone that could not be read or trusted (see the log); {} neither finished nor undone: inspect {}",
            r.execution_id,
            r.workflow_id,
            counted(r.untrusted, "snapshot folder"),
            if r.untrusted == 1 {
                "the action it belongs to was"
            } else {
                "the actions they belong to were"
            },
            match self.workflow_folders(&r.workflow_id).as_slice() {
                [] => format!(".rollback/{}/", r.workflow_id),
                folders => folders
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        )
    }
}

fn unreadable_record(r: &Recovered) -> String {
    let removed = match &r.record_left {
        None => "was removed".to_owned(),
        Some(why) => format!(
            "could not be removed either ({why}): remove inflight/{}.json from the state directory once that is put right",
            r.workflow_id
        ),
    };
    let unfinished = match r.unfinished_snapshots_removed {
        0 => String::new(),
        n => format!(
            "; {} its run never finished removed",
            counted(n, "snapshot folder")
        ),
    };
    format!(
        "the run record of workflow {} could not be read (torn by a crash, or changed by hand) and {removed}; a write its run left unrecorded, if any, was neither finished nor undone: `audit verify` and the workflow's files show what it did{unfinished}",
        r.workflow_id
    )
}

/// Why the run is not settled and when it will be, if it is not.
fn not_settled(r: &Recovered) -> Option<String> {
    // A commit log without a readable record names no run.
    let run = format!(
        "the interrupted {}{}{} of workflow {}",
        r.what(),
        if r.execution_id.is_empty() { "" } else { " " },
        r.execution_id,
        r.workflow_id
    );
    if !r.missing_roots.is_empty() {
        // Notices reach clients (a server's state): the roots, outside this
        // process's, are named in the log only.
        let one = r.missing_roots.len() == 1;
        tracing::warn!(workflow = %r.workflow_id, roots = %r.missing_roots.join(", "), "an interrupted run wrote into roots this start lacks");
        Some(format!(
            "{run} wrote into {} this start is not configured with or skipped (missing, say; the log names {}), so it was neither finished nor undone; it is recovered by a start that has {} as the run left it",
            if one { "a root" } else { "roots" },
            if one { "it" } else { "them" },
            if one { "that root" } else { "those roots" }
        ))
    } else if !r.unjudged.is_empty() {
        Some(format!(
            "{run} was neither finished nor undone: {}; it is recovered at the first start after that second hard link, symbolic link or special file is gone",
            r.unjudged.join("; ")
        ))
    } else if let Some(busy) = &r.busy {
        Some(format!(
            "{run} was neither finished nor undone: {busy}; it is recovered at the next start or the workflow's next run"
        ))
    } else if r.retry {
        // What stopped it may have come after some of the run was settled (its
        // files undone, their lines unwritten): say only that it is not done.
        Some(format!(
            "{run} could not be settled now ({}); its record is kept, and its recovery runs again at the next start or the workflow's next run",
            r.why.as_deref().unwrap_or("see the log")
        ))
    } else {
        None
    }
}

fn rollback_settled(r: &Recovered) -> String {
    // The stopped rollback recorded its own restores up to a moment; only
    // those after it are left to recovery, often none.
    let recorded = match (r.restores_recorded, r.restores_on_trail) {
        // Killed before its first restore changed anything (none done, none put back
        // unconfirmed).
        (0, 0) => "it had restored nothing".to_owned(),
        (0, _) => "every restore it made was already on the audit trail".to_owned(),
        (n, _) => format!(
            "{} it made recorded on the audit trail",
            counted(n, "restore")
        ),
    };
    // The restore of a created file removes the folders its action made on the way;
    // a rollback killed before it had removed them all leaves the rest to recovery.
    let recorded = match r.folders_removed {
        0 => recorded,
        n => format!(
            "{recorded}, and {} the restored actions had made on the way removed, as their restores would have",
            counted(n, "folder")
        ),
    };
    // A failed run's own rollback (`on_failure: rollback`) goes by that run's id and
    // undid that run's actions alone; a workflow's rollback undoes its other runs too.
    let (whose, of, then) = if r.failed_run_rollback {
        (
            "the run's",
            "of the run",
            "which a rollback of the workflow restores (with the workflow's other runs)",
        )
    } else {
        (
            "the workflow's",
            "of the workflow",
            "which rolling it back again restores",
        )
    };
    let left = match r.not_rolled_back {
        0 => format!("none of {whose} writes is left to roll back"),
        n => format!("{} {of} not rolled back, {then}", counted(n, "action")),
    };
    format!(
        "recovered interrupted {} {} of workflow {}: {recorded}{}; {left}",
        r.what(),
        r.execution_id,
        r.workflow_id,
        earlier_tries(r),
    )
}

/// What an earlier recovery settled is on the trail, not in a notice's counts: the run
/// or rollback may not have settled by itself (empty when no earlier start tried).
fn earlier_tries(r: &Recovered) -> String {
    match r.earlier_tries {
        0 => String::new(),
        n => format!(
            " ({} began recovering it before and did not finish: what {} settled, if anything, is on the workflow's lines of the audit trail, not counted here)",
            if n == 1 {
                "an earlier start".to_owned()
            } else {
                format!("{n} earlier starts")
            },
            if n == 1 { "it" } else { "they" }
        ),
    }
}

fn run_settled(r: &Recovered) -> String {
    // Only what recovery did: a run killed between actions leaves all zeros.
    let done: Vec<String> = [
        (r.rolled_back, "unfinished action", " rolled back"),
        (r.completed, "action", " finished"),
        (
            r.superseded,
            "action",
            " left undone, its target changed since by another run or program",
        ),
        (r.temp_files_removed, "temporary file", " removed"),
        (
            r.unfinished_snapshots_removed,
            "unfinished snapshot folder",
            " removed",
        ),
        (r.restores_recorded, "restore", " recorded"),
    ]
    .into_iter()
    .filter(|(n, _, _)| *n > 0)
    .map(|(n, what, done)| format!("{}{done}", counted(n, what)))
    .collect();
    let not_undone = (!r.not_undone.is_empty()).then(|| {
        format!(
            "{} not undone, left as the dead run wrote {} ({})",
            counted(r.not_undone.len(), "unfinished action"),
            if r.not_undone.len() == 1 {
                "it"
            } else {
                "them"
            },
            r.not_undone.join("; ")
        )
    });
    let not_undone = match (not_undone, logged_left_changed(r)) {
        (Some(n), Some(l)) => Some(format!("{n}; {l}")),
        (n, l) => n.or(l),
    };
    let mut done = match (done.is_empty(), not_undone) {
        // Its finished writes stand as audited; none was left half done.
        (true, None) => "no unfinished action was left to undo or finish".to_owned(),
        (true, Some(n)) => n,
        (false, None) => done.join(", "),
        (false, Some(n)) => format!("{}; {n}", done.join(", ")),
    };
    done.push_str(&earlier_tries(r));
    format!(
        "recovered interrupted run {} of workflow {}: {done}",
        r.execution_id, r.workflow_id
    )
}

/// The logged targets someone changed since, which the replay left as they are.
fn logged_left_changed(r: &Recovered) -> Option<String> {
    (!r.logged_left_changed.is_empty()).then(|| {
        format!(
            "{} of its logged writes found changed since by another run or program and left as found ({}): the audit trail still names the logged bytes; if that change was not wanted, roll the workflow back (with force) or write the file again",
            counted(r.logged_left_changed.len(), "target"),
            r.logged_left_changed.join(", ")
        )
    })
}

/// The folders recovery could not list for the dead process's temporary files (those
/// it knew by name it removed, or said it could not).
fn unlisted(r: &Recovered) -> Option<String> {
    (!r.temp_folders_unlisted.is_empty()).then(|| {
        format!(
            "recovery of {} (workflow {}) may not list {} to look for the dead process's temporary files (permission denied; those whose names it knew are dealt with): look there for files named .ailab-tmp-… and remove any by hand",
            r.execution_id,
            r.workflow_id,
            r.temp_folders_unlisted.join(", "),
        )
    })
}

/// What recovery left for the operator to remove.
fn left_for_the_operator(r: &Recovered) -> impl Iterator<Item = String> + '_ {
    let one = r.unfinished_snapshots_left.len() == 1;
    // (where, what it was, what for, what to remove)
    [
        (
            &r.temp_files_left,
            "the dead process's temporary files (named .ailab-tmp-…) in",
            "",
            "them",
        ),
        if one {
            (
                &r.unfinished_snapshots_left,
                "the snapshot folder its process began and never finished (no meta.json; its action never ran)",
                ": its action id stays used until it is gone",
                "it",
            )
        } else {
            (
                &r.unfinished_snapshots_left,
                "the snapshot folders its process began and never finished (no meta.json; their actions never ran)",
                ": their action ids stay used until they are gone",
                "them",
            )
        },
    ]
    .into_iter()
    .filter(|(left, ..)| !left.is_empty())
    .map(|(left, what, then, them)| {
        format!(
            "{} could not remove {what} {}{then}; remove {them} by hand once that is put right",
            recovery_of(r),
            left.join(", ")
        )
    })
}

/// "recovery of RUN (workflow W)", or of the workflow alone when no record named its run.
fn recovery_of(r: &Recovered) -> String {
    if r.execution_id.is_empty() {
        format!("recovery of workflow {}", r.workflow_id)
    } else {
        format!(
            "recovery of {} (workflow {})",
            r.execution_id, r.workflow_id
        )
    }
}
