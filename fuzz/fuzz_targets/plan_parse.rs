//! Any bytes as a plan: parsing and validation never panic, and every action of a valid
//! plan renders (or refuses) without panicking.
#![no_main]

use ailab_sandbox_core::catalog::op_for_intent;
use ailab_sandbox_core::confine::normalize_extension;
use ailab_sandbox_core::plan::{parse_plan, render};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(plan) = parse_plan(data) else { return };
    let Ok(valid) = plan.validate() else { return };
    for a in valid.actions() {
        assert!(ailab_sandbox_core::plan::is_valid_id(a.id()));
        if let Some(op) = op_for_intent(&a.intent) {
            let ext = normalize_extension(&a.path);
            let _ = render(op, a, &ext, a.content.as_deref().map(str::as_bytes));
        }
    }
});
