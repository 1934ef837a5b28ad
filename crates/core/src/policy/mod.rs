//! Governance: permission scopes and phases, chmod detection, risk, and
//! `check_sandbox_governance`, which returns a decision value rather than an error.
//!
//! Values in, values out, but for one step: given the roots, `check_target` looks at the
//! target through its root's handle (links, special files, its kind, what this process may
//! change), since SPEC §5 orders those checks among governance's.

mod chmod;
mod governance;
mod permission;

pub use chmod::{CHMOD_PATTERN_COUNT, detect_chmod_intent};
pub(crate) use governance::check_found_kind;
pub use governance::{
    Approval, GovernanceContext, GovernanceRequest, assess_sandbox_risk, check_content_size,
    check_intent, check_sandbox_governance, check_size, check_target, intent_refusal,
    never_allowed, resolve_target,
};
pub use permission::{
    DEFAULT_PHASE, PermissionScope, WRITE_PHASES, allowed_scopes, classify_permission_scope,
    is_scope_allowed, phase_supports_sandbox_write, write_phases_listed,
};
