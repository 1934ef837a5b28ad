//! The refusals a file operation beneath a root ends in, and how an I/O error met on
//! the way maps to one (`SandboxRoot::map_error` and its kin, which know the root's own
//! paths, build on these).

use crate::confine::path::{RelPath, shown_path};
use crate::reason::{ReasonCode, Refusal};
use std::io;

/// The refusal for a file `name` that changed after it was read, just before it would
/// have been replaced or removed.
pub(super) fn changed_meanwhile(name: &str) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} was changed by another program after it was read; it was left as it is, with that change: check what it holds now, then try again",
            shown_path(name)
        ),
    )
}

/// The refusal for a removal of `name`, judged missing, that found a file there: put
/// there by another program since, or back with its folder.
pub(super) fn appeared_meanwhile(name: &str) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} was not there when it was judged, and a file stands there now (another program put it there, or moved its folder back); it was left as it is: check what it holds, then try again",
            shown_path(name)
        ),
    )
}

/// The refusal for a removal of `name` that found it written to by another program once
/// moved aside (or its folder `moved` away), and another file at its name by then: what
/// it held is kept as `kept`.
pub(super) fn kept_aside(name: &str, kept: &str, moved: bool) -> Refusal {
    let temporary = temporary_note(kept);
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} {} as it was being removed, and another file took its name meanwhile; it was not removed: what it holds is kept beside it as {}{temporary}, to be moved back by hand",
            shown_path(name),
            if moved {
                "had its directory moved away by another program"
            } else {
                "was changed by another program"
            },
            shown_path(kept)
        ),
    )
}

/// The refusal for a removal of `name` that moved it aside, then could not put it back
/// under its name (`back`), after its unlink failed (`unlink`), or having found it
/// changed or its folder `moved` away (where the runtime may change nothing): it stays
/// as `kept`.
pub(super) fn stays_aside(
    name: &str,
    kept: &str,
    (unlink, back): (Option<&std::io::Error>, &std::io::Error),
    moved: bool,
) -> Refusal {
    let why = match (moved, unlink) {
        (true, _) => "its directory was moved away from that path as it was being removed",
        (false, Some(_)) => "it was being removed",
        (false, None) => "another program changed it as it was being removed",
    };
    let failed = match unlink {
        Some(e) => format!(
            "it could be neither removed ({}) nor put back under its name ({})",
            crate::error::io_words(e),
            crate::error::io_words(back)
        ),
        None => format!(
            "it could not be put back under its name ({})",
            crate::error::io_words(back)
        ),
    };
    let (then, back_too) = if moved {
        (
            "in its directory, wherever that went, as",
            " (and its directory put back)",
        )
    } else {
        ("beside where it was, as", "")
    };
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{}: {why}, and {failed}; it was not removed: it stays {then} {}{}, to be moved back by hand{back_too}, then roll back again",
            shown_path(name),
            shown_path(kept),
            temporary_note(kept)
        ),
    )
}

/// The refusal for a removal of `name` that moved it aside, from where another program
/// took it before the runtime removed it or put it back.
pub(super) fn taken_from_aside(name: &str) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} was moved aside to be removed, and another program took it from there before the runtime removed it or put it back; nothing was removed by the runtime: find where it went, then roll back again",
            shown_path(name)
        ),
    )
}

/// What a refusal adds of a file kept for a person under `kept`: nothing for a kept
/// name; for a temporary name, that the runtime may take it for a leftover.
fn temporary_note(kept: &str) -> &'static str {
    if kept.starts_with(crate::confine::path::TEMP_MARKER) {
        " (a temporary name, which the runtime may remove as a leftover of a process that died: move it now)"
    } else {
        ""
    }
}

/// The refusal for a write whose new bytes did not take `name`'s place: another program
/// renamed something over the temporary file beside it before it was moved there (a
/// file being replaced is kept; a missing target's place may hold that program's).
pub(super) fn replaced_before_placed(name: &str) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the new bytes for {} did not take its place: another program replaced the temporary file beside it just before it was to be moved there; a file that stood there is kept (unless the filesystem cannot exchange two names), and where none stood, that program's may stand there now: check what it holds, then try again",
            shown_path(name)
        ),
    )
}

/// `Ok` when `m`, what stands at `name`, is a plain file with no other link: all that a
/// write or removal taking its target as it is ([`super::Put::Any`], a forced rollback)
/// ever replaces or removes. Else the refusal for what another program put there since
/// the target was judged, left in place.
pub(super) fn only_plain(name: &str, m: &cap_std::fs::Metadata) -> Result<(), Refusal> {
    use cap_std::fs::MetadataExt as _;
    if m.is_file() && m.nlink() == 1 {
        Ok(())
    } else {
        Err(put_there_meanwhile(name, m))
    }
}

/// The refusal for a write or removal that found at `name`, as it was to replace or
/// remove the file there, what is no plain file (`m` describes it): another program put
/// it there since the target was judged (a forced rollback takes the target as it is).
/// It is left in place.
fn put_there_meanwhile(name: &str, m: &cap_std::fs::Metadata) -> Refusal {
    use cap_std::fs::MetadataExt as _;
    // A file with other links may be the very one judged, linked since.
    let (what, done) = if m.is_dir() {
        ("a directory".to_owned(), "put it there")
    } else if m.file_type().is_symlink() {
        ("a symbolic link".to_owned(), "put it there")
    } else if m.is_file() {
        (
            format!("a file with {} hard links", m.nlink()),
            "gave it another name or put it there",
        )
    } else {
        ("a FIFO, socket or device".to_owned(), "put it there")
    };
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} was {what} just as it was to be replaced or removed: another program {done} since it was judged; it was left in place, and nothing was written there: move it away, then try again",
            shown_path(name)
        ),
    )
}

/// The refusal for a write whose new bytes were put in place as `name`, after which
/// `then` failed with `e`: an I/O error, never taken for a refusal before anything was
/// touched (the target may hold the new bytes: undoing the write must look).
pub(super) fn failed_once_placed(name: &str, then: &str, e: &io::Error) -> Refusal {
    Refusal::new(
        ReasonCode::IoError,
        format!(
            "the new bytes for {} were put in its place, then {then} failed: {}",
            shown_path(name),
            crate::error::io_words(e)
        ),
    )
}

/// `r`, met after the folders `created` were made for a write, marked so
/// ([`Refusal::touched`]) for the write's undo to look at what is there and remove the
/// folders it made. A race with another writer (`conflict`: a folder removed or
/// replaced meanwhile) stays one, to try again; anything else is an I/O error (a
/// permission is `conflict` only before anything is touched).
pub(crate) fn made_then(created: &[String], r: Refusal) -> Refusal {
    if created.is_empty() || r.touched {
        return r;
    }
    if r.reason_code == ReasonCode::IoError {
        return Refusal { touched: true, ..r };
    }
    let race = r.reason_code == ReasonCode::Conflict && !r.denied;
    let mut then = Refusal::new(
        if race {
            r.reason_code
        } else {
            ReasonCode::IoError
        },
        format!(
            "{} {} made for it, then: {}",
            created
                .iter()
                .map(|c| shown_path(c))
                .collect::<Vec<_>>()
                .join(", "),
            if created.len() == 1 { "was" } else { "were" },
            r.reason
        ),
    );
    then.touched = true;
    then
}

/// The refusal for a file `name` that its name stopped naming while it was opened or
/// read.
pub(super) fn swapped_while_read(name: &str) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{} was moved, removed or replaced while it was being read (another program is changing it); nothing read from it is used: try again once it is left alone",
            shown_path(name)
        ),
    )
}

/// `r`, a refusal worded by a file operation that knew only the file's name in its
/// folder, naming the file by its root-relative path `rel` instead, as every other
/// refusal does: two files of one name in different folders are told apart.
pub(super) fn named_in_full(mut r: Refusal, rel: &RelPath) -> Refusal {
    if rel.components().len() > 1
        && let Some(rest) = r.reason.strip_prefix(&shown_path(rel.file_name()))
    {
        r.reason = format!("{}{rest}", shown_path(&rel.as_string()));
    }
    r
}

/// The refusal for a directory `comps` that was there when the action was checked and
/// is not now: something removed it meanwhile (a rollback taking away a directory it had
/// left empty, another program).
pub(super) fn removed_meanwhile(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the directory {} was removed while the action ran; nothing was written: try again",
            shown_path(&comps.join("/"))
        ),
    )
}

/// The refusal of a write whose folder `comps` is not the one the action's check found
/// there: removed and made again, or swapped, since.
pub(crate) fn not_as_checked(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the directory {} is not the one there when the action was checked (removed and made again, or swapped, meanwhile); nothing was written: run the plan again",
            shown_path(&comps.join("/"))
        ),
    )
}

/// Whether `dir`, an open folder, has been removed since it was opened (no link left):
/// what a name made in it is refused `ENOENT` for.
pub(super) fn removed_as_opened(dir: &cap_std::fs::Dir) -> bool {
    use cap_std::fs::MetadataExt;
    dir.dir_metadata().is_ok_and(|m| m.nlink() == 0)
}

/// The refusal of making the folder `comps` in `parent`, its open parent, which failed
/// with `e`: one refused because `parent` was removed meanwhile is that race, to try
/// again, not a failing disk (HTTP 500).
pub(super) fn mkdir_refusal(parent: &cap_std::fs::Dir, comps: &[String], e: &io::Error) -> Refusal {
    if e.kind() == io::ErrorKind::NotFound && comps.len() > 1 && removed_as_opened(parent) {
        return removed_meanwhile(&comps[..comps.len() - 1]);
    }
    io_refusal("create directory", comps, e)
}

/// The refusal for a write into the directory `comps`, refused for its permissions
/// because the directory was moved out of the root (or removed) while the action wrote
/// into it: Landlock refuses a write outside the root, and the permissions are not to
/// blame. What the write had made there (its temporary file) moved out with it, where
/// this process may not remove it.
pub(super) fn moved_meanwhile(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the directory {} was moved out of the root or removed while the action ran; nothing was written in the root (a temporary file of the write may be left in the moved directory, which this process may not touch outside the root): try again",
            shown_path(&comps.join("/"))
        ),
    )
}

/// The refusal for a write whose folder `comps` (root-relative) another program moved
/// away from that path while the write put its file in place (into another root, say):
/// the write is taken back there, what it replaced put back.
pub(super) fn moved_while_written(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the directory {} was moved away from that path while the action wrote into it; the write was taken back where the directory went, nothing of it left: try again",
            shown_path(&comps.join("/"))
        ),
    )
}

/// The refusal for a removal of `rel` whose folder another program moved away as it
/// was removed: the file was put back under its name, where the folder went.
pub(super) fn moved_while_removed(rel: &crate::confine::RelPath) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "the directory {} was moved away from that path as {} was being removed; nothing was removed (the file is where the directory went): put the directory back, then try again",
            shown_path(&rel.parent_components().join("/")),
            shown_path(&rel.as_string())
        ),
    )
}

/// The refusal for a new file `name` whose folder another program moved away as it was
/// put there, and that could not be taken back where the folder went (`e`).
pub(super) fn not_taken_back(name: &str, e: &std::io::Error) -> Refusal {
    Refusal::new(
        ReasonCode::Conflict,
        format!(
            "{}: its directory was moved away from that path while the action wrote into it, and the new file could not be taken back where the directory went ({}): it may stand there",
            shown_path(name),
            crate::error::io_words(e)
        ),
    )
}

/// The refusal for a path whose parent `comps` (root-relative) is not a directory; plan
/// validation gives the same answer for a parent an earlier action makes a file.
pub(crate) fn not_a_directory(comps: &[String]) -> Refusal {
    Refusal::new(
        ReasonCode::NotFound,
        format!(
            "{} is not a directory, so nothing can be placed beneath it",
            shown_path(&comps.join("/"))
        ),
    )
}

/// `path` is the path as the caller should see it (root-relative, or a file name). How
/// many links the file has is not said: the others may be names outside the sandbox,
/// and their count is none of the caller's business.
pub(super) fn hardlink_refusal(path: &str) -> Refusal {
    Refusal::new(
        ReasonCode::HardlinkRefused,
        format!(
            "{} has other hard links; a file with more than one link may alias a file outside the sandbox, so it is never read or written",
            shown_path(path)
        ),
    )
}

pub(super) fn special_refusal(rel: &RelPath) -> Refusal {
    Refusal::new(
        ReasonCode::NotRegularFile,
        format!(
            "{} is a FIFO, socket or device; only regular files and directories are handled",
            shown_path(&rel.as_string())
        ),
    )
}

/// An I/O failure as a refusal. The message names only the root-relative path, never
/// anything outside the sandbox.
pub(crate) fn io_refusal(what: &str, comps: &[String], e: &io::Error) -> Refusal {
    let target = if comps.is_empty() {
        "the sandbox root".to_owned()
    } else {
        shown_path(&comps.join("/"))
    };
    let mut said = format!("could not {what} {target}: {}", crate::error::io_words(e));
    // The filesystem of the path itself: one mounted inside the root may be read-only
    // or full while the root's is not.
    if let Some(advice) = crate::error::fs_advice(e, &format!("the filesystem holding {target}")) {
        said = format!("{said} ({advice})");
    }
    if is_denied(e) {
        // A permission someone set in the tree (another user's file or folder, a mode,
        // a sticky folder, an immutable mark): theirs to put right, not a failing disk,
        // as a rollback meeting one says.
        let mut r = Refusal::new(
            ReasonCode::Conflict,
            format!(
                "{said}; it, or a folder on its way, is another user's or closed to this process (its mode, a sticky folder, an immutable mark): give the runtime's user access there, or use another path"
            ),
        );
        r.denied = true;
        return r;
    }
    Refusal::new(ReasonCode::IoError, said)
}

/// Whether the system refused `e`'s operation on a path for its permissions (EACCES,
/// EPERM), as opposed to cap-std refusing an escape (no OS error number).
pub(crate) fn is_denied(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::ACCESS, Errno::PERM]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}
