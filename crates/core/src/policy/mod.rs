//! Governance: permission scopes and phases, chmod detection, risk, and
//! `check_sandbox_governance`, which returns a decision value rather than an error.

mod chmod;
mod governance;
mod permission;

pub use chmod::{CHMOD_PATTERN_COUNT, detect_chmod_intent};
pub(crate) use governance::check_found_kind;
pub use governance::{
    Approval, GovernanceContext, GovernanceRequest, assess_sandbox_risk, check_content_size,
    check_intent, check_sandbox_governance, check_size, check_target, intent_refusal,
    resolve_target,
};
pub use permission::{
    DEFAULT_PHASE, PermissionScope, WRITE_PHASES, allowed_scopes, classify_permission_scope,
    is_scope_allowed, phase_supports_sandbox_write, write_phases_listed,
};
