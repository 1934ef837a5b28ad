//! Properties over generated inputs: any path string is refused or lands inside the
//! root; the workflow machine only moves along its nine edges.

use crate::support::*;
use ailab_sandbox_core::confine::resolve_sandbox_path;
use ailab_sandbox_core::workflow::{WorkflowState, transition};
use proptest::prelude::*;
use serde_json::json;
use std::path::PathBuf;

fn path_token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just(String::new()),
        Just("~".to_owned()),
        Just("a".to_owned()),
        Just("b.txt".to_owned()),
        Just(".rollback".to_owned()),
        Just("lnk".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\\".to_owned()),
        Just("%2e%2e".to_owned()),
        "[a-z.]{1,6}",
        any::<String>(),
    ]
}

fn path_string() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        proptest::collection::vec(path_token(), 1..12),
    )
        .prop_map(|(abs, parts)| format!("{}{}", if abs { "/" } else { "" }, parts.join("/")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn lexical_resolution_is_refused_or_inside(path in path_string()) {
        let roots = vec![PathBuf::from("/srv/sandbox")];
        if let Ok(r) = resolve_sandbox_path(&path, &roots, None, 8) {
            let joined = ailab_sandbox_core::confine::path::join_display(&roots[0], &r.rel);
            prop_assert!(ailab_sandbox_core::confine::is_within_sandbox(&joined, &roots[0]));
            prop_assert!(r.rel.components().iter().all(|c| !c.is_empty() && c != ".." && c != "." && !c.contains('/')));
            prop_assert!(r.rel.depth() <= 8);
        }
    }

    #[test]
    fn transitions_follow_the_nine_edges(from in 0usize..6, to in 0usize..6) {
        let (f, t) = (WorkflowState::ALL[from], WorkflowState::ALL[to]);
        let legal = [
            ("planning", "executing"), ("planning", "failed"), ("executing", "mutating"),
            ("executing", "done"), ("executing", "failed"), ("mutating", "done"),
            ("mutating", "failed"), ("done", "rolled_back"), ("failed", "rolled_back"),
        ];
        let expected = legal.contains(&(f.as_str(), t.as_str()));
        prop_assert_eq!(transition(f, t).is_ok(), expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Real writes through the root handle, with a symlink to outside and a hard link to
    /// an outside file planted in the root: whatever the path, nothing outside changes and
    /// every written file is inside.
    #[test]
    fn real_writes_stay_inside(paths in proptest::collection::vec(path_string(), 1..4)) {
        let w = World::new();
        std::fs::create_dir_all(w.path("a")).unwrap();
        std::os::unix::fs::symlink(&w.outside, w.path("lnk")).unwrap();
        std::fs::hard_link(w.outside.join("secret.txt"), w.path("b.txt")).unwrap();
        let before = w.outside_tree();
        let sb = w.sandbox();
        for p in paths {
            let _ = sb.run_plan(plan(json!({"actions": [
                {"intent": "append_file", "path": p, "content": "pwned"}]})));
        }
        prop_assert_eq!(w.outside_tree(), before);
    }
}
