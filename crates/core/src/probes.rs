//! What a plan refused unread readably asks for that is forbidden: a forbidden intent, a
//! shell or interpreter as its tool, a permission change in its description. Such asks
//! go on the trail blocked however the rest of the plan is broken (a field unknown or of
//! the wrong type, an id malformed or given twice, an element that is no action), so
//! that an agent probing for a shell or a delete leaves a trace. Nothing else of the
//! text is trusted, and nothing of it is built but the probes themselves.

use crate::plan::{Action, MAX_ACTIONS_PER_PLAN, Plan};
use crate::reason::ReasonCode;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// The plan of the probes in the text `json` of a plan refused unread (its workflow
/// the one it names, if valid), or `None` when it holds none or is not JSON the reader
/// can go through. Looked for among the first [`MAX_ACTIONS_PER_PLAN`] elements of its
/// actions, as many as a plan holds: a readable plan of as many forbidden actions
/// leaves as many lines, and judging more would cost time by the text's size.
pub(crate) fn of_unread_plan(json: &[u8]) -> Option<Plan> {
    let Loose {
        workflow_id,
        probes,
    } = serde_json::from_slice(json).ok()?;
    (!probes.is_empty()).then(|| Plan {
        workflow_id: workflow_id.filter(|w| crate::plan::is_valid_id(w)),
        actions: probes,
        ..Plan::default()
    })
}

/// Whether `action` asks for what is never allowed.
fn is_probe(action: &Action) -> bool {
    matches!(
        crate::policy::intent_refusal(&action.intent, action.tool.as_deref()).reason_code,
        ReasonCode::ForbiddenIntent | ReasonCode::ChmodForbidden
    ) || action
        .description
        .as_deref()
        .is_some_and(|d| crate::policy::detect_chmod_intent(d).is_some())
}

/// `raw` when it is a string.
fn text(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

/// A plan's top level as far as it can be read: its workflow id if a string, the
/// probes among its actions.
#[derive(Default)]
struct Loose {
    workflow_id: Option<String>,
    probes: Vec<Action>,
}

impl<'de> de::Deserialize<'de> for Loose {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LooseVisitor)
    }
}

struct LooseVisitor;

impl<'de> Visitor<'de> for LooseVisitor {
    type Value = Loose;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a plan")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Loose, A::Error> {
        let mut loose = Loose::default();
        while let Some(key) = map.next_key::<String>()? {
            let raw: &RawValue = map.next_value()?;
            match key.as_str() {
                "workflow_id" => loose.workflow_id = text(raw),
                // The last list given, as a reader that keeps the last of a key.
                "actions" if raw.get().starts_with('[') => {
                    if let Ok(List(found)) = serde_json::from_str(raw.get()) {
                        loose.probes = found;
                    }
                }
                _ => {}
            }
        }
        Ok(loose)
    }
}

/// The probes among the first [`MAX_ACTIONS_PER_PLAN`] elements of a list of actions:
/// the others are gone through, never built (a plan of millions of `{}` would take
/// gigabytes), and an element that is no object holds none.
struct List(Vec<Action>);

impl<'de> de::Deserialize<'de> for List {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(ListVisitor)
    }
}

struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = List;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of actions")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List, A::Error> {
        let mut found = Vec::new();
        for _ in 0..MAX_ACTIONS_PER_PLAN {
            let Some(raw) = seq.next_element::<&RawValue>()? else {
                return Ok(List(found));
            };
            if raw.get().starts_with('{')
                && let Ok(LooseAction(a)) = serde_json::from_str(raw.get())
                && is_probe(&a)
            {
                found.push(a);
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(List(found))
    }
}

/// An action's intent, path, tool and description where they are strings (the last of
/// a key given twice).
struct LooseAction(Action);

impl<'de> de::Deserialize<'de> for LooseAction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ActionVisitor)
    }
}

struct ActionVisitor;

impl<'de> Visitor<'de> for ActionVisitor {
    type Value = LooseAction;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an action")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LooseAction, A::Error> {
        let mut a = Action::default();
        while let Some(key) = map.next_key::<String>()? {
            let field = match key.as_str() {
                "intent" | "path" | "tool" | "description" => text(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            match key.as_str() {
                "intent" => a.intent = field.unwrap_or_default(),
                "path" => a.path = field.unwrap_or_default(),
                "tool" => a.tool = field,
                _ => a.description = field,
            }
        }
        Ok(LooseAction(a))
    }
}
