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
/// the one it names once, if valid), or `None` when it holds none or is not JSON the
/// reader can go through. Looked for among the first [`MAX_ACTIONS_PER_PLAN`] elements
/// of its actions (of every list given under that key, in turn), as many as a plan
/// holds: a readable plan of as many forbidden actions leaves as many lines, and judging
/// more would cost time by the text's size. A byte order mark is passed over, and bytes
/// that are not UTF-8 read as a replacement character.
pub(crate) fn of_unread_plan(json: &[u8]) -> Option<Plan> {
    let json = json.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(json);
    let text = String::from_utf8_lossy(json);
    let Loose {
        workflow_ids,
        probes,
    } = serde_json::from_str(&text).ok()?;
    (!probes.is_empty()).then(|| Plan {
        // Given twice, it is no plan's own: the probes go to a workflow of their own.
        workflow_id: match workflow_ids.as_slice() {
            [Some(w)] if crate::plan::is_valid_id(w) => Some(w.clone()),
            _ => None,
        },
        actions: probes,
        ..Plan::default()
    })
}

/// Values of one key of an action judged at most: a key given more often than this is
/// judged by its first ones.
const MAX_VALUES_JUDGED: usize = 8;

/// The action that asks for what is never allowed among those an action given each of
/// its keys' values would be (a key may be given twice: any of its values may be the
/// one a reader keeps), if any.
fn probe_of(fields: &Fields) -> Option<Action> {
    let tools: Vec<Option<&String>> = std::iter::once(None)
        .chain(
            fields
                .tool
                .iter()
                .filter(|t| t.len() <= crate::plan::MAX_TOOL_BYTES)
                .map(Some),
        )
        .collect();
    let intents: Vec<&str> = match fields.intent.as_slice() {
        [] => vec![""],
        given => given.iter().map(String::as_str).collect(),
    };
    let action = |intent: &str, tool: Option<&String>, description: Option<&String>| Action {
        intent: intent.to_owned(),
        path: fields.path.last().cloned().unwrap_or_default(),
        tool: tool.cloned(),
        description: description.cloned(),
        ..Action::default()
    };
    if let Some(d) = fields
        .description
        .iter()
        .find(|d| crate::policy::detect_chmod_intent(d).is_some())
    {
        return Some(action(intents[0], None, Some(d)));
    }
    intents.iter().find_map(|&intent| {
        tools.iter().find_map(|&tool| {
            matches!(
                crate::policy::intent_refusal(intent, tool.map(String::as_str)).reason_code,
                ReasonCode::ForbiddenIntent | ReasonCode::ChmodForbidden
            )
            .then(|| action(intent, tool, None))
        })
    })
}

/// `raw` when it is a string.
fn text(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

/// A plan's top level as far as it can be read: each workflow id given (if a string),
/// the probes among its actions.
#[derive(Default)]
struct Loose {
    workflow_ids: Vec<Option<String>>,
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
        let mut judged = 0;
        while let Some(key) = map.next_key::<String>()? {
            let raw: &RawValue = map.next_value()?;
            match key.as_str() {
                "workflow_id" => loose.workflow_ids.push(text(raw)),
                "actions" if raw.get().starts_with('[') && judged < MAX_ACTIONS_PER_PLAN => {
                    let mut de = serde_json::Deserializer::from_str(raw.get());
                    if let Ok(found) = de::DeserializeSeed::deserialize(
                        List {
                            room: MAX_ACTIONS_PER_PLAN - judged,
                        },
                        &mut de,
                    ) {
                        judged += found.judged;
                        loose.probes.extend(found.probes);
                    }
                }
                _ => {}
            }
        }
        Ok(loose)
    }
}

/// Judges the first `room` elements of a list of actions: the others are gone through,
/// never built (a plan of millions of `{}` would take gigabytes), and an element that is
/// no object holds no probe.
struct List {
    room: usize,
}

/// What [`List`] found: the probes, and how many elements it judged.
struct Found {
    probes: Vec<Action>,
    judged: usize,
}

impl<'de> de::DeserializeSeed<'de> for List {
    type Value = Found;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for List {
    type Value = Found;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of actions")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let mut found = Found {
            probes: Vec::new(),
            judged: 0,
        };
        while found.judged < self.room {
            let Some(raw) = seq.next_element::<&RawValue>()? else {
                return Ok(found);
            };
            found.judged += 1;
            if raw.get().starts_with('{')
                && let Ok(fields) = serde_json::from_str::<Fields>(raw.get())
                && let Some(a) = probe_of(&fields)
            {
                found.probes.push(a);
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(found)
    }
}

/// The string values an action gives for the keys a probe is judged by, each key's
/// first [`MAX_VALUES_JUDGED`].
#[derive(Default)]
struct Fields {
    intent: Vec<String>,
    path: Vec<String>,
    tool: Vec<String>,
    description: Vec<String>,
}

impl<'de> de::Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an action")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
        let mut f = Fields::default();
        while let Some(key) = map.next_key::<String>()? {
            let values = match key.as_str() {
                "intent" => &mut f.intent,
                "path" => &mut f.path,
                "tool" => &mut f.tool,
                "description" => &mut f.description,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if let Some(v) = text(map.next_value()?)
                && values.len() < MAX_VALUES_JUDGED
            {
                values.push(v);
            }
        }
        Ok(f)
    }
}
