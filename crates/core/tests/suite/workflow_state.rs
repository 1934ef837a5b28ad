//! The workflow state machine of SPEC §6.

use WorkflowState::{Done, Executing, Failed, Mutating, Planning, RolledBack};
use ailab_sandbox_core::workflow::{IllegalTransition, WorkflowState, transition};

/// The nine allowed transitions of SPEC §6.
const LEGAL: [(WorkflowState, WorkflowState); 9] = [
    (Planning, Executing),
    (Planning, Failed),
    (Executing, Mutating),
    (Executing, Done),
    (Executing, Failed),
    (Mutating, Done),
    (Mutating, Failed),
    (Done, RolledBack),
    (Failed, RolledBack),
];

fn all_pairs() -> Vec<(WorkflowState, WorkflowState)> {
    WorkflowState::ALL
        .iter()
        .flat_map(|&a| WorkflowState::ALL.iter().map(move |&b| (a, b)))
        .collect()
}

#[test]
fn every_legal_transition_is_allowed() {
    for (from, to) in LEGAL {
        assert!(from.can_transition(to), "{from} -> {to}");
        assert_eq!(transition(from, to), Ok(to), "{from} -> {to}");
    }
}

#[test]
fn every_other_pair_is_illegal() {
    let pairs = all_pairs();
    assert_eq!(pairs.len(), 36);
    let illegal: Vec<_> = pairs.into_iter().filter(|p| !LEGAL.contains(p)).collect();
    assert_eq!(illegal.len(), 27);
    for (from, to) in illegal {
        assert!(!from.can_transition(to), "{from} -> {to}");
        assert_eq!(
            transition(from, to),
            Err(IllegalTransition { from, to }),
            "{from} -> {to}"
        );
    }
}

#[test]
fn self_transitions_are_illegal() {
    for s in WorkflowState::ALL {
        assert!(transition(s, s).is_err(), "{s}");
    }
}

#[test]
fn rolled_back_is_the_only_terminal_state() {
    let terminal: Vec<_> = WorkflowState::ALL
        .into_iter()
        .filter(|s| s.is_terminal())
        .collect();
    assert_eq!(terminal, [RolledBack]);
    for to in WorkflowState::ALL {
        assert!(transition(RolledBack, to).is_err(), "rolled_back -> {to}");
    }
}

#[test]
fn no_way_back_to_planning_or_from_done_to_failed() {
    for from in WorkflowState::ALL {
        assert!(transition(from, Planning).is_err(), "{from} -> planning");
    }
    assert!(transition(Done, Failed).is_err());
    assert!(transition(Failed, Done).is_err());
    assert!(transition(Planning, Mutating).is_err());
    assert!(transition(Planning, Done).is_err());
}

#[test]
fn a_full_run_and_its_rollback_walk_the_machine() {
    let mut s = Planning;
    for next in [Executing, Mutating, Done, RolledBack] {
        s = transition(s, next).unwrap();
    }
    assert_eq!(s, RolledBack);
}

#[test]
fn wire_names_and_error_message() {
    let names: Vec<&str> = WorkflowState::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(
        names,
        [
            "planning",
            "executing",
            "mutating",
            "done",
            "failed",
            "rolled_back"
        ]
    );
    for s in WorkflowState::ALL {
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            format!("\"{}\"", s.as_str())
        );
        assert_eq!(s.to_string(), s.as_str());
    }
    let err = transition(RolledBack, Done).unwrap_err();
    assert_eq!(
        err.to_string(),
        "illegal workflow transition rolled_back -> done"
    );
}
