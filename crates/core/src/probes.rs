//! What a plan refused unread readably asks for that is forbidden: a forbidden intent, a
//! shell or interpreter as its tool, a permission change in its description. Such asks
//! go on the trail blocked however the rest of the plan is broken (a field unknown or of
//! the wrong type, an id malformed or given twice, an element that is no action), so
//! that an agent probing for a shell or a delete leaves a trace. Nothing else of the
//! text is trusted, and nothing of it is built but the probes themselves.
//!
//! Such a plan (refused unread by the CLI or HTTP) is read leniently, from the first 1,000
//! elements of its first and latest lists of actions (the first and last value of each
//! key), without building the rest; the executor puts the probes on the trail blocked, so a
//! broken sibling hides no probe for a shell or a delete.

use crate::plan::{Action, MAX_ACTIONS_PER_PLAN, Plan};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// The plan of the probes in the text `json` of a plan refused unread (its workflow
/// the one it names once, if valid), or `None` when it holds none or is not JSON the
/// reader can go through. Looked for among the first [`MAX_ACTIONS_PER_PLAN`] elements
/// of its actions (of the latest list given under that key, and of the first), as many
/// as a plan holds: a readable plan of as many forbidden actions leaves as many lines, and judging
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

/// The action that asks for what is never allowed, if any, among those an action
/// would be given the first or the last value of each of its keys (a key given twice:
/// readers keep one or the other): a forbidden intent, a shell or interpreter as the
/// tool of a write, or a permission change in the description. Each value is judged
/// once, as a readable plan's would be, and a tool's name past what a plan takes by its
/// first and last words within that length.
fn probe_of(fields: &Fields) -> Option<Action> {
    let action = |intent: &str, tool: Option<String>, description: Option<&String>| Action {
        intent: intent.to_owned(),
        path: fields.path.last().cloned().unwrap_or_default(),
        tool,
        description: description.cloned(),
        ..Action::default()
    };
    let forbidden = crate::policy::never_allowed;
    let first_intent = fields.intent.first().map_or("", String::as_str);
    if let Some(d) = fields
        .description
        .iter()
        .find(|d| crate::policy::detect_chmod_intent(d).is_some())
    {
        return Some(action(first_intent, None, Some(d)));
    }
    if let Some(intent) = fields.intent.iter().find(|i| forbidden(i, None)) {
        return Some(action(intent, None, None));
    }
    // A tool is judged with a write's intent (another intent is refused for itself).
    let write = fields
        .intent
        .iter()
        .find(|i| crate::catalog::is_sandbox_write_intent(i))?;
    fields
        .tool
        .iter()
        .flat_map(|t| within_tool_limit(t))
        .find(|t| forbidden(write, Some(t)))
        .map(|t| action(write, Some(t), None))
}

/// A tool's name as a plan takes it: whole within [`crate::plan::MAX_TOOL_BYTES`], else
/// its first and its last whole words within that length.
fn within_tool_limit(tool: &str) -> Vec<String> {
    let max = crate::plan::MAX_TOOL_BYTES;
    if tool.len() <= max {
        return vec![tool.to_owned()];
    }
    let mut head = max;
    while !tool.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = tool.len() - max;
    while !tool.is_char_boundary(tail) {
        tail += 1;
    }
    let head = &tool[..head];
    let tail = &tool[tail..];
    // Whole words: a cut one could read as another name (`…xbash`).
    let head = head.rsplit_once(char::is_whitespace).map_or("", |(h, _)| h);
    let tail = tail.split_once(char::is_whitespace).map_or("", |(_, t)| t);
    [head, tail]
        .into_iter()
        .filter(|t| !t.trim().is_empty())
        .map(str::to_owned)
        .collect()
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
        // The first list given and the latest (a reader keeps one or the other).
        let mut lists: Vec<&'de RawValue> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let raw: &RawValue = map.next_value()?;
            match key.as_str() {
                "workflow_id" => loose.workflow_ids.push(text(raw)),
                "actions" if raw.get().starts_with('[') => {
                    lists.truncate(1);
                    lists.push(raw);
                }
                _ => {}
            }
        }
        // The latest first, a thousand elements of each judged; a thousand probes kept.
        for raw in lists.into_iter().rev() {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let room = MAX_ACTIONS_PER_PLAN;
            if let Ok(found) = de::DeserializeSeed::deserialize(List { room }, &mut de) {
                let keep = MAX_ACTIONS_PER_PLAN - loose.probes.len();
                loose.probes.extend(found.probes.into_iter().take(keep));
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

/// The string values an action gives for the keys a probe is judged by: each key's
/// first and last (a reader keeps one or the other of a key given twice).
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
            if let Some(v) = text(map.next_value()?) {
                // The first and the latest: at most two kept.
                values.truncate(1);
                values.push(v);
            }
        }
        Ok(f)
    }
}
