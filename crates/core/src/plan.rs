//! Plans: the JSON a caller submits (SPEC §6), its parsing and validation, and the bytes
//! each operation would leave on disk (`render`: JSON, YAML, TOML and INI serialisation,
//! exact-text edits).

use crate::catalog::{Effect, Format, Operation, Payload};
use crate::confine::path::shown_path;
use crate::reason::{ReasonCode, Refusal, Verdict};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashSet;

/// Most actions a single plan may hold.
pub const MAX_ACTIONS_PER_PLAN: usize = 1000;

/// Most `sandbox_transform` edits a single plan may hold, all actions together. Each edit
/// scans its whole file (up to 5 MiB) during validation and again when it runs, so this
/// bounds the work one request can ask for.
pub const MAX_EDITS_PER_PLAN: usize = 256;

/// Most values (scalars, arrays, objects, at any depth) the `data` of a single plan may
/// hold, all actions together, an object with members counted as [`OBJECT_WEIGHT`] and
/// each of its keys as one more. Parsed, each value takes tens of bytes, many times its
/// text: this bounds the memory one request can ask for (some 150 MiB, strings' text
/// aside). A scalar, an array or an empty object renders to at least two bytes, so data
/// of those never needs more than half its operation's largest file (2 MiB) and a plan
/// holds two such actions; data of very many small objects (`{"a":0}` counts 18 and
/// renders in 7 bytes) is refused before its file would be, at some 116,500 of them.
pub const MAX_DATA_VALUES_PER_PLAN: usize = 2 * 1024 * 1024;

/// Data of fewer values than this (a few MiB parsed) is small: the HTTP and MCP faces,
/// which pace plans and calls by the data they may hold ([`data_values_bound`]), let such
/// a plan or call pass beside large ones without taking room.
pub const SMALL_DATA_VALUES: usize = 64 * 1024;

/// How many values an object with members counts as toward
/// [`MAX_DATA_VALUES_PER_PLAN`], its keys aside: parsed, even `{"a": 0}` takes a tree node
/// of eleven entries, some 640 bytes, where a number takes 32 (an empty object takes no
/// node, and counts as one). Counted as one, a plan of a million such objects (8 MB of
/// text) would take 700 MB.
pub const OBJECT_WEIGHT: usize = 16;

/// An upper bound on what the `data` of the plan whose text is `json` can count toward
/// [`MAX_DATA_VALUES_PER_PLAN`], capped there (a plan counting more is refused as it is
/// read, before it is all built), from the text alone, strings skipped: every value but
/// the first follows a `[`, `,` or `:` (a `:` also follows a key), and every object
/// opens with a `{`. For a server that bounds the memory of the plans it parses at once
/// before parsing them: a plan whose data is small takes next to nothing, whatever its
/// strings hold.
pub fn data_values_bound(json: &[u8]) -> usize {
    let mut n = 1usize;
    let mut bytes = json.iter().enumerate();
    while let Some((i, &b)) = bytes.next() {
        n = n.saturating_add(match b {
            b'[' | b',' => 1,
            b':' => 2,
            b'{' => match json[i + 1..].iter().find(|c| !c.is_ascii_whitespace()) {
                Some(b'}') => 1,
                _ => OBJECT_WEIGHT,
            },
            b'"' => {
                // To the string's closing quote: what it holds is text, not values.
                while let Some((_, &c)) = bytes.next() {
                    match c {
                        b'\\' => {
                            bytes.next();
                        }
                        b'"' => break,
                        _ => {}
                    }
                }
                0
            }
            _ => 0,
        });
        if n >= MAX_DATA_VALUES_PER_PLAN {
            return MAX_DATA_VALUES_PER_PLAN;
        }
    }
    n
}

/// Deepest nesting of arrays and objects in an action's `data`: the most a JSON plan can
/// hold (the parser stops at 128 levels counting the plan's own), so that a `Plan` built
/// in Rust is held to what the other faces take, and rendering, which recurses, cannot
/// run out of stack.
pub const MAX_DATA_DEPTH: usize = 124;

/// What to do when an action fails mid-run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Roll back every earlier action of the run (default).
    #[default]
    Rollback,
    /// Stop; the workflow ends `failed` and can be rolled back later.
    Stop,
}

/// Read from a string only: serde's derived enum meets any other value with a syntax
/// error ("a value was expected here"), which names neither the field nor what it takes.
impl<'de> Deserialize<'de> for OnFailure {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Named;
        impl serde::de::Visitor<'_> for Named {
            type Value = OnFailure;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"rollback\" or \"stop\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<OnFailure, E> {
                match s {
                    "rollback" => Ok(OnFailure::Rollback),
                    "stop" => Ok(OnFailure::Stop),
                    other => Err(E::unknown_variant(other, &["rollback", "stop"])),
                }
            }
        }
        d.deserialize_str(Named)
    }
}

/// One exact-text replacement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// Text that must occur exactly once.
    pub old: String,
    /// Its replacement.
    pub new: String,
}

/// One write action.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// Generated when absent.
    #[serde(default)]
    pub action_id: Option<String>,
    /// The intent, e.g. `create_file`.
    pub intent: String,
    /// The target path.
    pub path: String,
    /// Text, for the content-taking operations.
    #[serde(default)]
    pub content: Option<String>,
    /// A structured value, for `write_json`, `write_yaml`, `generate_config`. Parsed from
    /// JSON text, an object that gives a key twice is refused.
    #[serde(default, deserialize_with = "reading::data")]
    pub data: Option<serde_json::Value>,
    /// Edits, for `sandbox_transform`.
    #[serde(default, deserialize_with = "reading::edits")]
    pub edits: Option<Vec<Edit>>,
    /// What the action is for (searched for chmod requests).
    #[serde(default)]
    pub description: Option<String>,
    /// Which root (by its configured path); default the first.
    #[serde(default)]
    pub root: Option<String>,
    /// The tool that asked.
    #[serde(default)]
    pub tool: Option<String>,
    /// The artifact this one derives from.
    #[serde(default)]
    pub parent_artifact_id: Option<String>,
}

/// A plan as submitted.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Generated when absent.
    #[serde(default)]
    pub workflow_id: Option<String>,
    /// The workflow this one continues, if any.
    #[serde(default)]
    pub parent_workflow_id: Option<String>,
    /// Rollback (default) or stop.
    #[serde(default)]
    pub on_failure: Option<OnFailure>,
    /// The actions, run in order.
    #[serde(deserialize_with = "reading::actions")]
    pub actions: Vec<Action>,
}

/// A plan whose ids are all present and valid, within the plan's limits. Only
/// [`Plan::validate`] makes one, so an executor is never handed a plan that skipped it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidPlan {
    pub(crate) workflow_id: String,
    pub(crate) parent_workflow_id: Option<String>,
    pub(crate) on_failure: OnFailure,
    pub(crate) actions: Vec<Action>,
}

impl ValidPlan {
    /// The workflow.
    pub fn workflow_id(&self) -> &str {
        &self.workflow_id
    }

    /// Its parent.
    pub fn parent_workflow_id(&self) -> Option<&str> {
        self.parent_workflow_id.as_deref()
    }

    /// Failure policy.
    pub fn on_failure(&self) -> OnFailure {
        self.on_failure
    }

    /// Actions with ids filled in.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }
}

/// The most characters an id may have.
pub const MAX_ID_LEN: usize = 64;

/// The longest name an action's `tool` may have: governance reads every word of it,
/// and no tool is named in more.
pub const MAX_TOOL_BYTES: usize = 1024;

/// What [`is_valid_id`] takes, as a regular expression (for schemas).
pub const ID_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

/// Whether `id` matches [`ID_PATTERN`].
pub fn is_valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Refuses an id that could not be a folder name.
pub fn check_id(kind: &str, id: &str) -> Verdict {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(Refusal::new(
            ReasonCode::InvalidId,
            format!(
                "{kind} {} is not a valid id; ids are 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                shown_path(id)
            ),
        ))
    }
}

/// A new workflow id.
pub fn new_workflow_id() -> String {
    format!("wf_{}", crate::ids::unique())
}

/// A new action id (unique across runs, so a workflow spanning many runs never reuses one).
pub fn new_action_id() -> String {
    format!("act_{}", crate::ids::unique())
}

/// A new execution id.
pub fn new_execution_id() -> String {
    format!("ex_{}", crate::ids::unique())
}

/// How a plan's JSON is read beyond serde's defaults. `data` as sent, refusing an object
/// that gives a key twice: serde_json keeps the last value and drops the others unseen,
/// so the file would not hold what the caller wrote. And the plan's limits (actions,
/// edits, data values) counted as it is read, so that a plan past them is refused
/// before it is all built.
mod reading {
    use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Number, Value};
    use std::fmt;

    pub(super) fn data<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        let Unique(v) = Unique::deserialize(d)?;
        Ok((!v.is_null()).then_some(v))
    }

    /// What the plan being parsed may still hold.
    #[derive(Clone, Copy)]
    struct Allowance {
        values: usize,
        edits: usize,
    }

    thread_local! {
        /// What the plan being parsed on this thread may still hold; `None`: no plan is
        /// being parsed, nothing is counted.
        static LEFT: std::cell::Cell<Option<Allowance>> = const { std::cell::Cell::new(None) };
    }

    /// Counts `data` values and edits for the duration of a plan's parse (see
    /// [`super::MAX_DATA_VALUES_PER_PLAN`], [`super::MAX_EDITS_PER_PLAN`]): a plan past
    /// either is refused before it is all built, so a refused plan never holds more than
    /// the allowance in memory.
    /// A count started inside another (a refusal's words read the text again) gives the
    /// outer one back what it had left when it ends.
    pub(super) struct Counting(Option<Allowance>);

    impl Counting {
        pub(super) fn start() -> Self {
            Self(LEFT.with(|c| {
                c.replace(Some(Allowance {
                    values: super::MAX_DATA_VALUES_PER_PLAN,
                    edits: super::MAX_EDITS_PER_PLAN,
                }))
            }))
        }
    }

    impl Drop for Counting {
        fn drop(&mut self) {
            LEFT.with(|c| c.set(self.0));
        }
    }

    /// Charges `n` of what `take` picks out of the allowance; `refuse` says why when
    /// fewer are left.
    fn charge<E: Error>(
        take: impl FnOnce(&mut Allowance) -> &mut usize,
        n: usize,
        refuse: impl FnOnce() -> String,
    ) -> Result<(), E> {
        LEFT.with(|c| {
            let Some(mut left) = c.get() else {
                return Ok(());
            };
            let have = take(&mut left);
            if *have < n {
                return Err(E::custom(refuse()));
            }
            *have -= n;
            c.set(Some(left));
            Ok(())
        })
    }

    fn one<E: Error>() -> Result<(), E> {
        values(1)
    }

    /// A key of an object: one value, and for its first the rest of the object's
    /// [`super::OBJECT_WEIGHT`] (its tree node), the object itself counted as one.
    fn key<E: Error>(first: bool) -> Result<(), E> {
        values(if first { super::OBJECT_WEIGHT } else { 1 })
    }

    fn values<E: Error>(n: usize) -> Result<(), E> {
        charge(
            |a| &mut a.values,
            n,
            || {
                format!(
                    "the data holds more than {} values (numbers, strings, arrays, objects, an object with members counted as {} and each key as one more, for the memory they take) in all; split it over several plans or calls, or over several files (a file of many small objects counts the most)",
                    super::MAX_DATA_VALUES_PER_PLAN,
                    super::OBJECT_WEIGHT
                )
            },
        )
    }

    /// An action's `edits`, charged to the plan's allowance as they are read.
    pub(super) fn edits<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<super::Edit>>, D::Error> {
        struct Edits;
        impl<'de> Visitor<'de> for Edits {
            type Value = Option<Vec<super::Edit>>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of edits")
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(self)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(Object(e)) = seq.next_element::<Object<super::Edit>>()? {
                    charge(
                        |a| &mut a.edits,
                        1,
                        || {
                            format!(
                                "the plan has more than {0} edits in all; at most {0} are allowed in one plan, so split the changes over several plans or calls",
                                super::MAX_EDITS_PER_PLAN
                            )
                        },
                    )?;
                    out.push(e);
                }
                Ok(Some(out))
            }
        }
        d.deserialize_option(Edits)
    }

    /// A struct read from an object only. serde's derived struct takes an array too,
    /// field by field in the order the source declares them: `["a1", "create_file",
    /// "a.txt"]` would run as an action whose meaning hangs on that order, which no
    /// caller sees.
    struct Object<T>(T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            T::deserialize(ObjectOnly(d)).map(Object)
        }
    }

    /// A deserializer handing its visitor objects only (see [`Object`]).
    struct ObjectOnly<D>(D);

    impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectOnly<D> {
        type Error = D::Error;
        fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_any(NoArray(v))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            name: &'static str,
            fields: &'static [&'static str],
            v: V,
        ) -> Result<V::Value, D::Error> {
            self.0.deserialize_struct(name, fields, NoArray(v))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    /// A visitor taking what `V` takes from an object, and nothing else: the rest is
    /// refused as a value of the wrong type, in `V`'s words of what was expected.
    struct NoArray<V>(V);

    impl<'de, V: Visitor<'de>> Visitor<'de> for NoArray<V> {
        type Value = V::Value;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.expecting(f)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
            self.0.visit_map(map)
        }
    }

    /// A plan's `actions`, refused past [`super::MAX_ACTIONS_PER_PLAN`] before more
    /// are built.
    pub(super) fn actions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<super::Action>, D::Error> {
        struct Actions;
        impl<'de> Visitor<'de> for Actions {
            type Value = Vec<super::Action>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of actions")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(Object(a)) = seq.next_element::<Object<super::Action>>()? {
                    if out.len() == super::MAX_ACTIONS_PER_PLAN {
                        return Err(A::Error::custom(format!(
                            "the plan has more than {0} actions; at most {0} are allowed in one plan, so split it over several plans or calls",
                            super::MAX_ACTIONS_PER_PLAN
                        )));
                    }
                    out.push(a);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Actions)
    }

    /// Reads JSON text through, refusing an object that gives a key twice. Nothing is
    /// built but the keys of the objects being read: the text may be a message far
    /// larger than what it is checked for.
    pub(super) fn scan(json: &[u8]) -> serde_json::Result<()> {
        serde_json::from_slice::<Scan>(json).map(drop)
    }

    struct Scan;

    impl<'de> Deserialize<'de> for Scan {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(ScanVisitor)
        }
    }

    struct ScanVisitor;

    impl<'de> Visitor<'de> for ScanVisitor {
        type Value = Scan;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E: Error>(self, _: bool) -> Result<Scan, E> {
            one().map(|()| Scan)
        }
        fn visit_i64<E: Error>(self, _: i64) -> Result<Scan, E> {
            one().map(|()| Scan)
        }
        fn visit_u64<E: Error>(self, _: u64) -> Result<Scan, E> {
            one().map(|()| Scan)
        }
        fn visit_f64<E: Error>(self, _: f64) -> Result<Scan, E> {
            one().map(|()| Scan)
        }
        fn visit_str<E: Error>(self, _: &str) -> Result<Scan, E> {
            one().map(|()| Scan)
        }
        fn visit_unit<E: Error>(self) -> Result<Scan, E> {
            one().map(|()| Scan)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scan, A::Error> {
            one()?;
            while seq.next_element::<Scan>()?.is_some() {}
            Ok(Scan)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scan, A::Error> {
            one()?;
            let mut keys = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                self::key(keys.is_empty())?;
                map.next_value::<Scan>()?;
                if let Some(key) = keys.replace(key) {
                    return Err(A::Error::custom(format!(
                        "the key {} appears twice in one object; give each key once",
                        crate::confine::path::shown_path(&key)
                    )));
                }
            }
            Ok(Scan)
        }
    }

    struct Unique(Value);

    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(UniqueVisitor)
        }
    }

    struct UniqueVisitor;

    impl<'de> Visitor<'de> for UniqueVisitor {
        type Value = Unique;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E: Error>(self, b: bool) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::Bool(b)))
        }
        fn visit_i64<E: Error>(self, n: i64) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::Number(n.into())))
        }
        fn visit_u64<E: Error>(self, n: u64) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::Number(n.into())))
        }
        fn visit_f64<E: Error>(self, n: f64) -> Result<Unique, E> {
            one()?;
            Ok(Unique(
                Number::from_f64(n).map_or(Value::Null, Value::Number),
            ))
        }
        fn visit_str<E: Error>(self, s: &str) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::String(s.to_owned())))
        }
        fn visit_string<E: Error>(self, s: String) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::String(s)))
        }
        fn visit_none<E: Error>(self) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::Null))
        }
        fn visit_unit<E: Error>(self) -> Result<Unique, E> {
            one()?;
            Ok(Unique(Value::Null))
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Unique, D::Error> {
            Unique::deserialize(d)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            one()?;
            let mut items = Vec::new();
            while let Some(Unique(v)) = seq.next_element()? {
                items.push(v);
            }
            Ok(Unique(Value::Array(items)))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            one()?;
            let mut out = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                self::key(out.is_empty())?;
                let Unique(v) = map.next_value()?;
                if out.contains_key(&key) {
                    return Err(A::Error::custom(format!(
                        "the key {} appears twice in one object; give each key once",
                        crate::confine::path::shown_path(&key)
                    )));
                }
                out.insert(key, v);
            }
            Ok(Unique(Value::Object(out)))
        }
    }
}

/// Refuses (`invalid_plan`) JSON text holding an object that gives a key twice, which a
/// parser would read as the last value alone, or more values than
/// [`MAX_DATA_VALUES_PER_PLAN`] (counted as read, so that such text is never all built).
/// For faces that receive plans parsed elsewhere, like [`check_numbers_kept`];
/// [`parse_plan`] refuses such `data` itself.
pub fn check_unique_keys(json: &[u8]) -> Verdict {
    let _counting = reading::Counting::start();
    reading::scan(json).map_err(|e| {
        Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the message is not valid: {}{}",
                crate::shape_words::placed(&e),
                parse_hint(&e, json)
            ),
        )
    })
}

/// What to change when the parser stopped where its own words say only what it hit: its
/// nesting limit (which counts every level of the text, the envelope's included), or a
/// byte of `json` that is not UTF-8.
fn parse_hint(e: &serde_json::Error, json: &[u8]) -> String {
    let said = e.to_string();
    if said.starts_with("recursion limit exceeded") {
        " (arrays and objects nest fewer than 128 levels deep, counting those that hold the data: flatten the data)".to_owned()
    } else if said.starts_with("invalid unicode code point")
        && let Err(bad) = std::str::from_utf8(json)
    {
        // The parser names a code point; what is wrong is a byte of the text.
        let at = bad.valid_up_to();
        format!(
            " (byte 0x{:02X} at offset {at} is not UTF-8: JSON text is UTF-8, so save the text as UTF-8, or write the character as a \\u escape)",
            json[at]
        )
    } else {
        String::new()
    }
}

/// Parses plan JSON; unknown fields and wrong types are `invalid_plan`.
pub fn parse_plan(json: &[u8]) -> Verdict<Plan> {
    // serde would also read a struct from a JSON array; a plan is an object.
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        let bom = if json.starts_with(b"\xEF\xBB\xBF") {
            " (it starts with a byte order mark, which JSON does not allow: save it as UTF-8 without one)".to_owned()
        } else if json.starts_with(b"\xFF\xFE") || json.starts_with(b"\xFE\xFF") {
            " (it starts with a UTF-16 byte order mark: save it as UTF-8)".to_owned()
        } else if let Err(bad) = std::str::from_utf8(json) {
            let at = bad.valid_up_to();
            format!(
                " (it is not UTF-8 text: byte 0x{:02X} at offset {at} is not part of a UTF-8 character)",
                json[at]
            )
        } else if json.iter().all(u8::is_ascii_whitespace) {
            format!(
                " (it is empty{}: nothing was read)",
                if json.is_empty() {
                    ""
                } else {
                    " but for white space"
                }
            )
        } else {
            String::new()
        };
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the plan is not valid: it must be a JSON object with an \"actions\" array{bom}"
            ),
        ));
    }
    let counting = reading::Counting::start();
    let plan: Plan = serde_json::from_slice(json).map_err(|e| {
        // A number beyond a double's range: named, as one that would lose digits is.
        if e.to_string().starts_with("number out of range")
            && let Err(r) = check_numbers_kept(json)
        {
            return r;
        }
        // A value in the wrong place is named by its place, read again (within the same
        // allowance) to find it.
        let said = crate::shape_words::worded::<Plan>(json, &e, "the plan");
        Refusal::new(
            ReasonCode::InvalidPlan,
            format!("the plan is not valid: {said}{}", parse_hint(&e, json)),
        )
    })?;
    drop(counting);
    // Only a number held as a double can have lost digits; most plans have none.
    if plan
        .actions
        .iter()
        .any(|a| a.data.as_ref().is_some_and(has_float))
    {
        check_numbers_kept(json)?;
    }
    Ok(plan)
}

/// How many values `v` holds (itself included, an object with members counted as
/// [`OBJECT_WEIGHT`] and each key as one more) and how deep its arrays and objects nest, walked without recursion
/// (the data may be deeper than the stack allows).
fn data_shape(v: &serde_json::Value) -> (usize, usize) {
    use serde_json::Value;
    let (mut values, mut deepest) = (0usize, 0);
    let mut todo = vec![(v, 0usize)];
    while let Some((v, depth)) = todo.pop() {
        values = values.saturating_add(match v {
            Value::Object(map) if !map.is_empty() => OBJECT_WEIGHT + map.len(),
            _ => 1,
        });
        match v {
            Value::Array(items) => {
                deepest = deepest.max(depth + 1);
                todo.extend(items.iter().map(|i| (i, depth + 1)));
            }
            Value::Object(map) => {
                deepest = deepest.max(depth + 1);
                todo.extend(map.values().map(|i| (i, depth + 1)));
            }
            _ => {}
        }
    }
    (values, deepest)
}

fn has_float(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// Refuses (`invalid_plan`) a number in the JSON text `json` that the runtime would not
/// write back as the same value. Numbers are held as 64-bit integers or doubles, so
/// `12345678901234567890123` or `0.1000000000000000000001` would reach the file changed;
/// the caller learns so and can send a string instead. Meant for text that parses as
/// JSON (strings are skipped by their quotes); faces that receive plans parsed elsewhere
/// run it on the text they were sent.
pub fn check_numbers_kept(json: &[u8]) -> Verdict {
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < json.len()
                    && matches!(json[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let token = std::str::from_utf8(&json[start..i]).unwrap_or_default();
                if !number_is_kept(token) {
                    // An integer minus zero has no integer to be kept as: it would come
                    // back as a double, -0.0.
                    let why = if token.trim_start_matches('-').bytes().all(|b| b == b'0') {
                        "an integer minus zero would be read as the double -0.0; send 0, or -0.0 if a negative zero is meant"
                    } else {
                        "numbers are held as 64-bit integers or doubles, about 15 significant digits and fewer below 1e-307; send it as a string to keep it exactly"
                    };
                    return Err(Refusal::new(
                        ReasonCode::InvalidPlan,
                        format!(
                            "the number {} cannot be kept as sent ({why})",
                            shown_number(token)
                        ),
                    ));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn shown_number(token: &str) -> String {
    if token.chars().count() > 40 {
        format!(
            "{}… ({} characters)",
            token.chars().take(40).collect::<String>(),
            token.len()
        )
    } else {
        token.to_owned()
    }
}

/// Whether `token` (a JSON number) survives a round trip through serde_json's `Value`.
fn number_is_kept(token: &str) -> bool {
    let is_integer = !token.contains(['.', 'e', 'E']);
    if is_integer {
        // serde_json keeps every i64 and u64 exactly; beyond them it falls back to f64,
        // and the file would hold a float (`1e+23`) where an integer was sent, read back
        // as another type, and mostly as another value, even when the double is exact.
        // `-0` is read as the double -0.0.
        return (token.parse::<i64>().is_ok() && token != "-0") || token.parse::<u64>().is_ok();
    }
    let Ok(n) = serde_json::from_str::<serde_json::Number>(token) else {
        return false;
    };
    decimal_value(token) == decimal_value(&n.to_string())
}

/// A decimal number's value as (negative, significant digits, exponent) with the digits
/// stripped of leading and trailing zeros: equal values give equal triples.
fn decimal_value(text: &str) -> (bool, String, i64) {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i64>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let lead = digits.len() - digits.trim_start_matches('0').len();
    let significant = digits.trim_matches('0');
    if significant.is_empty() {
        return (false, String::new(), 0);
    }
    // value = 0.{significant} × 10^point
    let point = int.len() as i64 - lead as i64 + exp;
    (negative, significant.to_owned(), point)
}

/// The refusal of an action id its workflow has already run (its trail says so): an id
/// names the action's snapshot folder, used once.
pub(crate) fn action_id_used(action_id: &str, workflow_id: &str) -> Refusal {
    Refusal::new(
        ReasonCode::InvalidId,
        format!(
            "action_id {} was already used in workflow {}; give each action a new id",
            shown_path(action_id),
            shown_path(workflow_id)
        ),
    )
}

/// The refusal of an action id whose snapshot folder already stands in `root` though
/// the audit trail records no action of that id in the workflow: left by a run that did
/// not finish (one recovery could not remove, and named), or put there by another
/// program.
pub(crate) fn action_folder_in_the_way(
    action_id: &str,
    workflow_id: &str,
    root: &std::path::Path,
) -> Refusal {
    let (action, workflow) = (shown_path(action_id), shown_path(workflow_id));
    let folder = root
        .join(crate::confine::path::ROLLBACK_DIR)
        .join(workflow_id)
        .join(action_id);
    Refusal::new(
        ReasonCode::InvalidId,
        format!(
            "action_id {action} cannot be used in workflow {workflow}: the folder {} already stands, though the audit trail records no action of that id in that workflow (left by a run that did not finish, or put there by another program); give the action a new id, or remove that folder if it holds nothing to keep",
            shown_path(&folder.display().to_string())
        ),
    )
}

impl Plan {
    /// Checks ids (`invalid_id`), fills in missing ones, and checks the plan's shape
    /// (`invalid_plan`).
    pub fn validate(self) -> Verdict<ValidPlan> {
        let workflow_id =
            checked_workflow_ids(self.workflow_id, self.parent_workflow_id.as_deref())?;
        check_action_counts(&self.actions)?;
        check_data_shape(&self.actions)?;
        let actions = with_action_ids(self.actions)?;
        Ok(ValidPlan {
            workflow_id,
            parent_workflow_id: self.parent_workflow_id,
            on_failure: self.on_failure.unwrap_or_default(),
            actions,
        })
    }
}

/// The plan's workflow id, checked, or a new one when it gave none, and its parent's,
/// checked: a workflow's id names its folders, so one that could not be a folder name is
/// refused before anything else of the plan is looked at.
fn checked_workflow_ids(workflow_id: Option<String>, parent: Option<&str>) -> Verdict<String> {
    let workflow_id = match workflow_id {
        Some(w) => {
            check_id("workflow_id", &w)?;
            w
        }
        None => new_workflow_id(),
    };
    if let Some(p) = parent {
        check_id("parent_workflow_id", p)?;
    }
    Ok(workflow_id)
}

/// Refuses a plan with no actions, more than a plan may hold, or more edits in all than
/// one plan may make: each edit scans its whole file, so the count bounds the work one
/// request can ask for, and it is taken before any action is looked at.
fn check_action_counts(actions: &[Action]) -> Verdict {
    if actions.is_empty() {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            "the plan has no actions; give at least one",
        ));
    }
    if actions.len() > MAX_ACTIONS_PER_PLAN {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the plan has {} actions; at most {MAX_ACTIONS_PER_PLAN} are allowed",
                actions.len()
            ),
        ));
    }
    if let Some((i, tool)) = actions
        .iter()
        .enumerate()
        .find_map(|(i, a)| Some((i, a.tool.as_deref()?)).filter(|(_, t)| t.len() > MAX_TOOL_BYTES))
    {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the tool of action {} is named in {} bytes; a tool's name is at most {MAX_TOOL_BYTES} bytes",
                i + 1,
                tool.len()
            ),
        ));
    }
    let edits: usize = actions
        .iter()
        .map(|a| a.edits.as_ref().map_or(0, Vec::len))
        .sum();
    if edits > MAX_EDITS_PER_PLAN {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the plan has {edits} edits in all; at most {MAX_EDITS_PER_PLAN} are allowed in one plan, so split the changes over several plans or calls"
            ),
        ));
    }
    Ok(())
}

/// Refuses data nested deeper than an action's may be, or more values in all than one
/// plan's may hold: rendering and checking such data would take more time and memory
/// than any file it could become is worth.
fn check_data_shape(actions: &[Action]) -> Verdict {
    // Counted while parsing JSON; a `Plan` built in Rust is counted here.
    let mut values = 0;
    for d in actions.iter().filter_map(|a| a.data.as_ref()) {
        let (n, depth) = data_shape(d);
        values += n;
        if depth > MAX_DATA_DEPTH {
            return Err(Refusal::new(
                ReasonCode::InvalidPlan,
                format!(
                    "an action's data nests arrays and objects {depth} levels deep; at most {MAX_DATA_DEPTH} are allowed: flatten the data"
                ),
            ));
        }
    }
    if values > MAX_DATA_VALUES_PER_PLAN {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "the plan's data holds {values} values in all, an object with members counted as {OBJECT_WEIGHT} and each key as one more; at most {MAX_DATA_VALUES_PER_PLAN} are allowed in one plan, so split it over several plans or calls"
            ),
        ));
    }
    Ok(())
}

/// The actions, each with its id checked or a new one given, and its parent artifact's
/// checked: an action is named by its id on the trail and in a rollback, so two with
/// the same id in one plan are refused.
fn with_action_ids(actions: Vec<Action>) -> Verdict<Vec<Action>> {
    let mut seen = HashSet::new();
    let mut checked = Vec::with_capacity(actions.len());
    for mut a in actions {
        let id = match a.action_id.take() {
            Some(id) => {
                check_id("action_id", &id)?;
                id
            }
            None => new_action_id(),
        };
        if let Some(p) = &a.parent_artifact_id {
            check_id("parent_artifact_id", p)?;
        }
        if !seen.insert(id.clone()) {
            return Err(Refusal::new(
                ReasonCode::InvalidPlan,
                format!(
                    "action_id {} appears twice in the plan; each action needs its own id",
                    shown_path(&id)
                ),
            ));
        }
        a.action_id = Some(id);
        checked.push(a);
    }
    Ok(checked)
}

impl Action {
    /// The id (always present after validation).
    pub fn id(&self) -> &str {
        self.action_id.as_deref().unwrap_or("")
    }
}

/// Refuses payload fields the operation does not take, and a missing one it needs.
pub fn check_payload(op: &Operation, a: &Action) -> Verdict {
    let given = [
        ("content", a.content.is_some()),
        // A null is no value, as JSON plans read it: a `Plan` built in Rust says the
        // same as its JSON text.
        ("data", a.data.as_ref().is_some_and(|d| !d.is_null())),
        ("edits", a.edits.is_some()),
    ];
    let wanted = match op.payload() {
        Payload::Content => Some("content"),
        Payload::Data => Some("data"),
        Payload::Edits => Some("edits"),
        Payload::None => None,
    };
    for (field, present) in given {
        if present && Some(field) != wanted {
            let takes = wanted.map_or("only a path".to_owned(), |w| format!("'{w}'"));
            return Err(Refusal::new(
                ReasonCode::InvalidPlan,
                format!("{} does not take '{field}'; it takes {takes}", op.name),
            ));
        }
    }
    if let Some(w) = wanted
        && !given.iter().any(|(f, p)| *f == w && *p)
    {
        // A null is taken as no value: the message says so, since one was sent.
        let what = if w == "data" {
            " (any JSON value except null)"
        } else {
            ""
        };
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!("{} needs '{w}'{what}", op.name),
        ));
    }
    // Before the target is looked at: edits that could change nothing are the plan's
    // fault whatever the file holds, and every face says so alike.
    a.edits.as_deref().map_or(Ok(()), check_edits)
}

/// Refuses an empty list of edits, or an edit with an empty `old`.
fn check_edits(edits: &[Edit]) -> Verdict {
    if edits.is_empty() {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            "sandbox_transform needs at least one edit",
        ));
    }
    match edits.iter().position(|e| e.old.is_empty()) {
        Some(i) => Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!(
                "edit {} has an empty 'old'; give the exact text to replace",
                i + 1
            ),
        )),
        None => Ok(()),
    }
}

/// The bytes an operation leaves at its target, given what is there now (`current`,
/// `None` when missing). Checks the operation's preconditions (`already_exists`,
/// `not_found`, `edit_not_found`, `edit_ambiguous`). `None` for `create_directory`.
/// Borrowed from the action when the bytes are its `content` as given.
pub fn render<'a>(
    op: &Operation,
    a: &'a Action,
    ext: &str,
    current: Option<&[u8]>,
) -> Verdict<Option<Cow<'a, [u8]>>> {
    let shown = shown_path(&a.path);
    // The action's own text, not a copy: it may be megabytes, and most writes are that.
    let content = || Cow::Borrowed(a.content.as_deref().unwrap_or("").as_bytes());
    static NULL: serde_json::Value = serde_json::Value::Null;
    let data = || a.data.as_ref().unwrap_or(&NULL);
    Ok(Some(match op.effect {
        Effect::Directory => return Ok(None),
        Effect::Create => {
            if current.is_some() {
                return Err(Refusal::new(
                    ReasonCode::AlreadyExists,
                    format!(
                        "{shown} already exists; {} never overwrites (use replace_file)",
                        op.name
                    ),
                ));
            }
            content()
        }
        Effect::Replace => {
            if current.is_none() {
                return Err(Refusal::new(
                    ReasonCode::NotFound,
                    format!(
                        "{shown} does not exist; {} needs an existing file (use create_file)",
                        op.name
                    ),
                ));
            }
            content()
        }
        Effect::Append => {
            let mut out = current.map(<[u8]>::to_vec).unwrap_or_default();
            out.extend_from_slice(a.content.as_deref().unwrap_or("").as_bytes());
            Cow::Owned(out)
        }
        Effect::Edit => {
            let Some(cur) = current else {
                return Err(Refusal::new(
                    ReasonCode::NotFound,
                    format!("{shown} does not exist; {} edits an existing file", op.name),
                ));
            };
            Cow::Owned(apply_edits(
                cur,
                a.edits.as_deref().unwrap_or(&[]),
                &a.path,
            )?)
        }
        Effect::Serialize(Format::Json) => Cow::Owned(to_json(indented_fits(op, data())?)?),
        Effect::Serialize(Format::Yaml) => Cow::Owned(to_yaml(indented_fits(op, data())?)?),
        Effect::Serialize(Format::ByExtension) => Cow::Owned(match ext {
            ".json" => to_json(indented_fits(op, data())?)?,
            ".yaml" | ".yml" => to_yaml(indented_fits(op, data())?)?,
            ".toml" => to_toml(toml_headers_fit(op, data())?)?,
            ".ini" => to_ini(data())?,
            _ => {
                return Err(Refusal::new(
                    ReasonCode::ExtensionNotAllowed,
                    format!("{} cannot write {ext} files", op.name),
                ));
            }
        }),
        Effect::Write => content(),
    }))
}

/// `data`, refused (`size_exceeded`) when its rendering in an indented format (JSON
/// pretty-printed, YAML) could not fit `op`'s largest file, before it is rendered: each
/// scalar or empty array or object nested `d` levels deep takes a line of its own of at
/// least `2 d` bytes there besides its own text, and each key its text, so deep data of a
/// few MiB, or one long string, would otherwise be rendered to hundreds of MiB only to be
/// refused.
fn indented_fits<'v>(
    op: &Operation,
    data: &'v serde_json::Value,
) -> Verdict<&'v serde_json::Value> {
    use serde_json::Value;
    let Some(max) = op.max_size_bytes else {
        return Ok(data);
    };
    let mut least = 0u64;
    let mut todo = vec![(data, 0u64)];
    while let Some((v, depth)) = todo.pop() {
        least = least.saturating_add(match v {
            Value::Array(items) if !items.is_empty() => 0,
            Value::Object(map) if !map.is_empty() => map.keys().map(|k| k.len() as u64).sum(),
            leaf => (2 * depth).saturating_add(scalar_len(leaf, false)),
        });
        if least > max {
            return Err(too_large_rendered(
                op,
                max,
                "its values and keys, and the indentation their nesting takes, come to more than that; split the data over several files (or, when it is deeply nested, flatten it)",
            ));
        }
        match v {
            Value::Array(items) => todo.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(map) => todo.extend(map.values().map(|i| (i, depth + 1))),
            _ => {}
        }
    }
    Ok(data)
}

/// `data`, refused (`size_exceeded`) when its TOML rendering could not fit `op`'s
/// largest file, before it is rendered: a table's header repeats the keys of its path
/// (`[server.tls.extra]`), and so does each element of an array of tables (`[[a.b]]`), so
/// long keys over many tables, a few MiB of text, would be rendered to gigabytes only to
/// be refused; and a float is written out in full (`5e-324` takes 326 bytes). A table
/// other than the top one has a header when it is an element of an array of tables, is
/// empty, or holds anything but tables. Scalars and the keys of the members that are not
/// tables count their text too.
fn toml_headers_fit<'v>(
    op: &Operation,
    data: &'v serde_json::Value,
) -> Verdict<&'v serde_json::Value> {
    use serde_json::Value;
    let Some(max) = op.max_size_bytes else {
        return Ok(data);
    };
    let tables = |v: &Value| match v {
        Value::Array(items) => !items.is_empty() && items.iter().all(Value::is_object),
        _ => false,
    };
    let mut least = 0u64;
    // Each value, the length of its path's keys while it is a table reached by tables
    // (`None` inside an inline array or table), and whether it is an array's element.
    let mut todo = vec![(data, Some(0u64), false)];
    while let Some((v, path, element)) = todo.pop() {
        let Value::Object(map) = v else {
            least = least.saturating_add(scalar_len(v, true));
            if let Value::Array(items) = v {
                todo.extend(items.iter().map(|i| (i, None, false)));
            }
            continue;
        };
        // Whether it holds anything but tables (an empty one counts as such).
        let mut plain = map.is_empty();
        for (key, item) in map {
            let table = path.is_some() && (item.is_object() || tables(item));
            if !table {
                plain = true;
                least = least.saturating_add(key.len() as u64);
            }
            let inner = path
                .filter(|_| table)
                .map(|p| p.saturating_add(key.len() as u64));
            match item {
                Value::Array(items) if inner.is_some() => {
                    todo.extend(items.iter().map(|i| (i, inner, true)));
                }
                _ => todo.push((item, inner, false)),
            }
        }
        if let Some(p) = path
            && (element || (p > 0 && plain))
        {
            least = least.saturating_add(p);
        }
    }
    if least > max {
        return Err(too_large_rendered(
            op,
            max,
            "its values and keys (TOML writes a float out in full: 1e-300 takes 302 bytes) and its tables' headers (each repeats the keys of the path to its table: [a.b.c]) come to more than that; write the data as JSON or YAML, shorten the keys, nest fewer tables, or split it over several files",
        ));
    }
    Ok(data)
}

/// The fewest bytes the scalar `v` (or an empty array or object) takes once rendered:
/// its text, or what it is written as (`true`, `null`, `[]`). In TOML a float is
/// written out in full, as Rust prints it; elsewhere in its shortest form. Escapes only
/// add.
fn scalar_len(v: &serde_json::Value, toml: bool) -> u64 {
    use serde_json::Value;
    match v {
        Value::String(s) => s.len() as u64,
        Value::Number(n) => match n.as_f64().filter(|_| toml && n.is_f64()) {
            Some(f) => display_len(&f),
            None => display_len(n),
        },
        Value::Bool(b) => display_len(b),
        Value::Null => 4,
        Value::Array(items) if items.is_empty() => 2,
        Value::Object(map) if map.is_empty() => 2,
        Value::Array(_) | Value::Object(_) => 0,
    }
}

/// How many bytes `v` prints as, without keeping them.
fn display_len(v: &impl std::fmt::Display) -> u64 {
    struct Count(u64);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len() as u64;
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = std::fmt::write(&mut count, format_args!("{v}"));
    count.0
}

/// The refusal of data whose rendering could not fit `op`'s largest file, `max` bytes.
fn too_large_rendered(op: &Operation, max: u64, why: &str) -> Refusal {
    Refusal::new(
        ReasonCode::SizeExceeded,
        format!(
            "{} would leave more than {max} bytes on disk, its limit ({}): {why}",
            op.name,
            crate::catalog::human_bytes(max)
        ),
    )
}

/// Applies exact-text edits in order, all or nothing.
pub fn apply_edits(current: &[u8], edits: &[Edit], path: &str) -> Verdict<Vec<u8>> {
    let shown = shown_path(path);
    let Ok(text) = std::str::from_utf8(current) else {
        return Err(Refusal::new(
            ReasonCode::InvalidPlan,
            format!("{shown} is not UTF-8 text; sandbox_transform edits text files only"),
        ));
    };
    check_edits(edits)?;
    let mut text = text.to_owned();
    for (i, e) in edits.iter().enumerate() {
        // Edits apply to what the ones before them left, which a caller may not have in
        // mind when a later edit's text was in the file as read.
        let shown = match i {
            0 => shown.clone(),
            1 => format!("{shown} once edit 1 is applied"),
            2 => format!("{shown} once edits 1 and 2 are applied"),
            _ => format!("{shown} once edits 1 to {i} are applied"),
        };
        let Some(at) = text.find(&e.old) else {
            return Err(Refusal::new(
                ReasonCode::EditNotFound,
                format!(
                    "edit {}: the text {} does not occur in {shown}",
                    i + 1,
                    shown_path(&e.old)
                ),
            ));
        };
        // Occurrences that overlap count too ("aa" occurs twice in "aaa"): a second one
        // may start one character after the first. One more search, linear in the text.
        let step = text[at..].chars().next().map_or(1, char::len_utf8);
        if text[at + step..].contains(e.old.as_str()) {
            let apart = text.matches(e.old.as_str()).count();
            let times = if apart > 1 {
                format!("{apart} times")
            } else {
                "more than once (the occurrences overlap)".to_owned()
            };
            return Err(Refusal::new(
                ReasonCode::EditAmbiguous,
                format!(
                    "edit {}: the text {} occurs {times} in {shown}; it must occur exactly once, so include more context",
                    i + 1,
                    shown_path(&e.old)
                ),
            ));
        }
        text.replace_range(at..at + e.old.len(), &e.new);
    }
    Ok(text.into_bytes())
}

fn serialize_error(format: &str, e: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        ReasonCode::InvalidPlan,
        format!("'data' cannot be written as {format}: {e}"),
    )
}

fn to_json(v: &serde_json::Value) -> Verdict<Vec<u8>> {
    let mut out = serde_json::to_vec_pretty(v).map_err(|e| serialize_error("JSON", e))?;
    out.push(b'\n');
    Ok(out)
}

fn to_yaml(v: &serde_json::Value) -> Verdict<Vec<u8>> {
    Ok(crate::yaml::to_string(v).into_bytes())
}

fn to_toml(v: &serde_json::Value) -> Verdict<Vec<u8>> {
    if !v.is_object() {
        return Err(serialize_error(
            "TOML",
            "a TOML document must be an object at the top",
        ));
    }
    if let Some(why) = toml_problem(v, &mut String::new()) {
        return Err(serialize_error("TOML", why));
    }
    toml::to_string(v)
        .map(String::into_bytes)
        .map_err(|e| serialize_error("TOML", e))
}

/// What TOML cannot hold, and where: `at` is the path to `v` (`server.ports[2]`).
fn toml_problem(v: &serde_json::Value, at: &mut String) -> Option<String> {
    use serde_json::Value;
    // `at` is written as TOML writes a key path: its parts are escaped as they go in.
    match v {
        Value::Null => Some(format!("'{}' is null, and TOML has no null", at)),
        // The writer would print it; every TOML reader refuses it.
        Value::Number(n) if n.is_u64() && n.as_i64().is_none() => Some(format!(
            "'{}' is {n}, and a TOML integer is at most {}",
            at,
            i64::MAX
        )),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            let len = at.len();
            at.push_str(&format!("[{i}]"));
            let found = toml_problem(item, at);
            at.truncate(len);
            found
        }),
        Value::Object(o) => o.iter().find_map(|(k, item)| {
            let len = at.len();
            if len > 0 {
                at.push('.');
            }
            // A key that is not bare is quoted, or `a.b` and `a` then `b` would read alike.
            let bare = !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if bare {
                at.push_str(k);
            } else {
                at.push_str(&format!("\"{}\"", k.escape_debug()));
            }
            let found = toml_problem(item, at);
            at.truncate(len);
            found
        }),
        _ => None,
    }
}

/// Why a key, section name or value would not read back as written, if it would not.
/// Readers trim around names and values, take a line opening with `;` or `#` as a
/// comment, and split a key at `=` or `:`.
fn ini_problem(what: &str, text: &str) -> Option<String> {
    let shown = text.escape_debug();
    let value = what == "value";
    let why = if text.contains(['\n', '\r']) {
        "has a line break"
    } else if text.chars().any(|c| c.is_control() && c != '\t') {
        "has a control character, which readers stop at or mangle"
    } else if text.trim() != text {
        "starts or ends with white space, which readers drop"
    } else if !value && text.starts_with('\u{feff}') {
        // A value follows `key = `: only a name can open a line.
        "starts with U+FEFF, which readers take for a byte order mark and drop"
    } else if what == "section name" && text == "DEFAULT" {
        "names the section readers (Python's configparser) take for defaults copied into every other section; give the section another name, or put its keys at the top of each section that needs them"
    } else if (value || what == "key") && text.starts_with([';', '#']) {
        "starts with ';' or '#', which readers take for a comment"
    } else if value && text.contains('%') {
        "holds '%', which Python's configparser reads as interpolation ('%(name)s') or refuses; write the file as TOML, or double it ('%%') if that is the reader"
    } else if value {
        return None;
    } else if text.is_empty() {
        "is empty"
    } else if what == "key" && text.contains(['=', ':', '[', ']']) {
        "has '=', ':', '[' or ']', which readers take for syntax"
    } else if text.contains(['[', ']']) {
        "has '[' or ']', which readers take for syntax"
    } else {
        return None;
    };
    Some(format!("the {what} '{shown}' {why}"))
}

/// INI: an object of sections, each an object of plain values written as `key = value`.
fn to_ini(v: &serde_json::Value) -> Verdict<Vec<u8>> {
    use serde_json::Value;
    let Value::Object(top) = v else {
        return Err(serialize_error(
            "INI",
            "an INI document must be an object at the top",
        ));
    };
    // Where a refusal is: readers take the same key in several sections.
    let place = |section: &str, key: &str| {
        format!(
            "key '{}' of section '{}'",
            key.escape_debug(),
            section.escape_debug()
        )
    };
    let scalar = |section: &str, key: &str, v: &Value| -> Verdict<String> {
        let s = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => {
                return Err(serialize_error(
                    "INI",
                    format!(
                        "{} is null, and INI has no null (an empty value reads back as \"\"); leave the key out or send \"\"",
                        place(section, key)
                    ),
                ));
            }
            _ => {
                return Err(serialize_error(
                    "INI",
                    format!(
                        "{} is nested too deep; INI holds sections of plain values",
                        place(section, key)
                    ),
                ));
            }
        };
        // The key's problem names the key; the value's, neither.
        let problem = match ini_problem("key", key) {
            Some(why) => Some(format!("{why} (in section '{}')", section.escape_debug())),
            None => ini_problem("value", &s).map(|why| format!("{why} ({})", place(section, key))),
        };
        if let Some(why) = problem {
            return Err(serialize_error("INI", why));
        }
        Ok(format!("{key} = {s}\n"))
    };
    // Readers fold the case of keys: two would become one, or an error.
    let case_clash = |within: &str, key: &str| {
        serialize_error(
            "INI",
            format!(
                "{within} has keys that differ only in case ('{}' and another); readers fold the case of keys",
                key.escape_debug()
            ),
        )
    };
    // A key before the first section header is a dialect: Python's configparser, git and
    // Windows read no such key (configparser refuses the whole file).
    if let Some((k, _)) = top.iter().find(|(_, v)| !v.is_object()) {
        return Err(serialize_error(
            "INI",
            format!(
                "'{}' is a plain value at the top level, outside any section, and INI readers such as Python's configparser read no key before the first [section] header; put it in a section ({{\"main\": {{\"{}\": …}}}}) or write the file as TOML",
                k.escape_debug(),
                k.escape_debug()
            ),
        ));
    }
    let mut out = String::new();
    for (k, v) in top.iter() {
        if let Value::Object(section) = v {
            if let Some(why) = ini_problem("section name", k) {
                return Err(serialize_error("INI", why));
            }
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!("[{k}]\n"));
            let mut seen = std::collections::HashSet::new();
            for (sk, sv) in section {
                if !seen.insert(sk.to_lowercase()) {
                    return Err(case_clash(&format!("section '{}'", k.escape_debug()), sk));
                }
                out.push_str(&scalar(k, sk, sv)?);
            }
        }
    }
    Ok(out.into_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The pattern schemas carry says what `is_valid_id` takes: its length bound too.
    #[test]
    fn the_id_pattern_is_the_id_check() {
        assert!(ID_PATTERN.ends_with(&format!("{{0,{}}}$", MAX_ID_LEN - 1)));
        assert!(is_valid_id(&"a".repeat(MAX_ID_LEN)) && !is_valid_id(&"a".repeat(MAX_ID_LEN + 1)));
        assert!(ID_PATTERN.starts_with("^[A-Za-z0-9][A-Za-z0-9._-]"));
        assert!(!is_valid_id("-a") && !is_valid_id("a/b") && is_valid_id("a.b_c-d"));
    }

    #[test]
    fn an_edit_refused_after_earlier_edits_says_so() {
        let edit = |old: &str, new: &str| Edit {
            old: old.to_owned(),
            new: new.to_owned(),
        };
        // "bc" is in the file as read, but not once "ab" is replaced.
        let why = apply_edits(b"abc", &[edit("ab", "X"), edit("bc", "Y")], "t.txt").unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::EditNotFound);
        assert!(
            why.reason
                .ends_with("does not occur in 't.txt' once edit 1 is applied"),
            "{}",
            why.reason
        );
        let why = apply_edits(
            b"a-b",
            &[edit("-", "+"), edit("b", "a"), edit("a", "c")],
            "t.txt",
        )
        .unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::EditAmbiguous);
        assert!(
            why.reason
                .contains("occurs 2 times in 't.txt' once edits 1 and 2 are applied;"),
            "{}",
            why.reason
        );
        let why = apply_edits(b"abc", &[edit("zz", "Y")], "t.txt").unwrap_err();
        assert!(
            why.reason.ends_with("does not occur in 't.txt'"),
            "{}",
            why.reason
        );
    }

    #[test]
    fn a_key_given_twice_in_data_is_refused() {
        let plan = br#"{"actions": [{"intent": "write_json", "path": "c.json",
            "data": {"a": [{"limit": 1, "limit": 1000}]}}]}"#;
        let why = parse_plan(plan).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(
            why.reason.contains("'limit' appears twice"),
            "{}",
            why.reason
        );
        let plan = br#"{"actions": [{"intent": "write_json", "path": "c.json",
            "data": {"a": [{"limit": 1}, {"limit": 2}], "n": null, "f": 0.5, "u": 18446744073709551615}}]}"#;
        let data = parse_plan(plan).unwrap().actions[0].data.clone().unwrap();
        assert_eq!(
            data,
            serde_json::json!({"a": [{"limit": 1}, {"limit": 2}], "n": null, "f": 0.5, "u": u64::MAX})
        );
        let plan = br#"{"actions": [{"intent": "write_json", "path": "c.json", "data": null}]}"#;
        let action = &parse_plan(plan).unwrap().actions[0];
        assert_eq!(action.data, None);
        // Refused saying what is allowed, since a value was sent.
        let op = crate::catalog::op_for_intent("write_json").unwrap();
        let why = check_payload(op, action).unwrap_err();
        assert_eq!(
            why.reason,
            "write_json needs 'data' (any JSON value except null)"
        );
    }

    /// A plan's data is counted across its actions, and refused before it is all
    /// built; the count ends with the parse.
    #[test]
    fn the_values_of_a_plans_data_are_bounded() {
        let action = |values: usize| {
            // An array of `values - 1` zeros: `values` values.
            let zeros = vec!["0"; values - 1].join(",");
            format!(r#"{{"intent": "write_json", "path": "c.json", "data": [{zeros}]}}"#)
        };
        let half = MAX_DATA_VALUES_PER_PLAN / 2;
        let fits = format!(r#"{{"actions": [{}, {}]}}"#, action(half), action(half));
        assert!(parse_plan(fits.as_bytes()).is_ok());
        let over = format!(r#"{{"actions": [{}, {}]}}"#, action(half), action(half + 1));
        let why = parse_plan(over.as_bytes()).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(
            why.reason.contains(&format!(
                "holds more than {MAX_DATA_VALUES_PER_PLAN} values"
            )),
            "{}",
            why.reason
        );
        // The next plan starts afresh.
        assert!(parse_plan(fits.as_bytes()).is_ok());
        // Text checked for a face that parses it elsewhere (MCP) is bounded too, so that
        // the check itself never builds more.
        let why = check_unique_keys(over.as_bytes()).unwrap_err();
        assert!(
            why.reason.contains(&format!(
                "holds more than {MAX_DATA_VALUES_PER_PLAN} values"
            )),
            "{}",
            why.reason
        );
        assert!(check_unique_keys(action(1000).as_bytes()).is_ok());
        assert!(parse_plan(fits.as_bytes()).is_ok());
        // An object with members counts as OBJECT_WEIGHT values, each key one more: it
        // takes that much more memory. An empty one takes none, and counts as one.
        let objects = |n: usize, one: &str| {
            let objects = vec![one; n].join(",");
            format!(
                r#"{{"actions": [{{"intent": "write_json", "path": "c.json", "data": [{objects}]}}]}}"#
            )
        };
        // The array; each object, its key and its value.
        let most = (MAX_DATA_VALUES_PER_PLAN - 1) / (OBJECT_WEIGHT + 2);
        let fits = objects(most, r#"{"a":0}"#);
        assert!(parse_plan(fits.as_bytes()).is_ok());
        assert!(data_values_bound(fits.as_bytes()) > most * (OBJECT_WEIGHT + 2));
        let over = objects(most + 1, r#"{"a":0}"#);
        let why = parse_plan(over.as_bytes()).unwrap_err().reason;
        assert!(
            why.contains("an object with members counted as 16 and each key as one more"),
            "{why}"
        );
        assert_eq!(data_values_bound(over.as_bytes()), MAX_DATA_VALUES_PER_PLAN);
        assert!(check_unique_keys(over.as_bytes()).is_err());
        assert!(parse_plan(objects(half, "{}").as_bytes()).is_ok());
        // A plan built in Rust is counted alike.
        let mut plan = parse_plan(fits.as_bytes()).unwrap();
        plan.actions[0]
            .data
            .as_mut()
            .and_then(|d| d.as_array_mut())
            .unwrap()
            .push(serde_json::json!({"a": 0}));
        let why = plan.validate().unwrap_err().reason;
        assert!(
            why.contains("an object with members counted as 16"),
            "{why}"
        );
        // The bound from the text holds for ordinary plans, and is small for them,
        // whatever their strings hold.
        let small = br#"{"workflow_id": "wf_a", "actions": [{"intent": "write_json", "path": "c.json", "data": {"k": [1, 2, {"x": "y"}]}}]}"#;
        assert!(parse_plan(small).is_ok());
        assert!(
            (40..100).contains(&data_values_bound(small)),
            "{}",
            data_values_bound(small)
        );
        let text = format!(
            r#"{{"actions": [{{"intent": "create_file", "path": "c.json", "content": "{}"}}]}}"#,
            r#"{\"a\": [1, {\"b\": 2}], \"c\\\\\": 3}, "#.repeat(10_000)
        );
        assert!(parse_plan(text.as_bytes()).is_ok());
        let bound = data_values_bound(text.as_bytes());
        assert!(bound < 50, "{bound}");
    }

    /// Actions past the plan's limit are refused while the plan is read, before they
    /// are all built.
    #[test]
    fn a_plan_is_read_up_to_its_largest_number_of_actions() {
        let plan = |n: usize| {
            let one = r#"{"intent": "create_file", "path": "a.txt", "content": ""}"#;
            format!(r#"{{"actions": [{}]}}"#, vec![one; n].join(","))
        };
        let fits = parse_plan(plan(MAX_ACTIONS_PER_PLAN).as_bytes()).unwrap();
        assert!(fits.validate().is_ok());
        let why = parse_plan(plan(MAX_ACTIONS_PER_PLAN + 1).as_bytes()).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(
            why.reason.contains("more than 1000 actions"),
            "{}",
            why.reason
        );
    }

    #[test]
    fn data_nested_too_deep_says_how_deep_it_may_go() {
        let deep = format!(
            r#"{{"actions": [{{"intent": "write_json", "path": "d.json", "data": {}{}}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let why = parse_plan(deep.as_bytes()).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(
            why.reason.contains("fewer than 128 levels deep"),
            "{}",
            why.reason
        );
    }

    fn nested(depth: usize) -> serde_json::Value {
        let mut v = serde_json::json!(1);
        for _ in 0..depth {
            v = serde_json::json!([v]);
        }
        v
    }

    /// A `Plan` built in Rust is held to the nesting and size limits a JSON plan meets
    /// while it is parsed, and the deepest data a JSON plan can carry passes both.
    #[test]
    fn data_built_in_rust_is_held_to_the_limits_of_json_plans() {
        let plan = |data: serde_json::Value| Plan {
            actions: vec![Action {
                intent: "write_json".to_owned(),
                path: "d.json".to_owned(),
                data: Some(data),
                ..Action::default()
            }],
            ..Plan::default()
        };
        let deepest_json = (1..200)
            .take_while(|&d| {
                let text = format!(
                    r#"{{"actions": [{{"intent": "write_json", "path": "d.json", "data": {}1{}}}]}}"#,
                    "[".repeat(d),
                    "]".repeat(d)
                );
                parse_plan(text.as_bytes()).is_ok()
            })
            .last()
            .unwrap_or(0);
        // The same depth whichever face the plan comes through.
        assert_eq!(deepest_json, MAX_DATA_DEPTH);
        assert!(plan(nested(MAX_DATA_DEPTH)).validate().is_ok());
        let why = plan(nested(MAX_DATA_DEPTH + 1)).validate().unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(why.reason.contains("125 levels deep"), "{}", why.reason);
        let wide = serde_json::Value::Array(vec![serde_json::json!(0); MAX_DATA_VALUES_PER_PLAN]);
        let why = plan(wide).validate().unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(why.reason.contains("2097153 values"), "{}", why.reason);
    }

    /// A lone surrogate escape is explained, whatever the parser called it.
    #[test]
    fn a_lone_surrogate_escape_is_explained() {
        for text in [
            r#"{"actions": [{"intent": "create_file", "path": "s.txt", "content": "a\ud800b"}]}"#,
            r#"{"actions": [{"intent": "create_file", "path": "s.txt", "content": "a\udc00b"}]}"#,
        ] {
            let why = parse_plan(text.as_bytes()).unwrap_err();
            assert!(
                why.reason.contains("must be one of a pair")
                    && !why.reason.contains("leading")
                    && why.reason.matches("one of a pair").count() == 1,
                "{}",
                why.reason
            );
            // Whichever reader met it (arguments parsed elsewhere, a rollback's body).
            let why = check_unique_keys(text.as_bytes()).unwrap_err();
            assert!(
                why.reason.contains("must be one of a pair"),
                "{}",
                why.reason
            );
            let e = serde_json::from_slice::<serde_json::Value>(text.as_bytes()).unwrap_err();
            let said =
                crate::shape_words::worded::<serde_json::Value>(text.as_bytes(), &e, "the body");
            assert!(said.contains("must be one of a pair"), "{said}");
        }
        // A \u with too few digits is named as such, not as no escape at all.
        let short =
            r#"{"actions": [{"intent": "create_file", "path": "s.txt", "content": "a\u12"}]}"#;
        let why = parse_plan(short.as_bytes()).unwrap_err();
        assert!(
            why.reason.contains("\\u and four hexadecimal digits"),
            "{}",
            why.reason
        );
    }

    /// Arguments checked by a face (MCP) get the same hint as a plan.
    #[test]
    fn arguments_nested_too_deep_say_how_deep_they_may_go() {
        let deep = format!("{{\"data\": {}{}}}", "[".repeat(200), "]".repeat(200));
        let why = check_unique_keys(deep.as_bytes()).unwrap_err();
        assert!(
            why.reason.contains("fewer than 128 levels deep"),
            "{}",
            why.reason
        );
    }

    /// A byte that is not UTF-8 inside a string is named as a byte, not as the code
    /// point the parser calls it.
    #[test]
    fn a_byte_that_is_not_utf8_is_named() {
        let plan = b"{\"actions\": [{\"intent\": \"create_file\", \"path\": \"a.txt\", \"content\": \"x\xFF\"}]}";
        let why = parse_plan(plan).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(
            why.reason.contains("byte 0xFF at offset 69 is not UTF-8"),
            "{}",
            why.reason
        );
        let args = b"{\"content\": \"\xC3\"}";
        let why = check_unique_keys(args).unwrap_err().reason;
        assert!(why.contains("byte 0xC3 at offset 13 is not UTF-8"), "{why}");
    }

    /// Where the parser stopped is set apart from what the refusal advises.
    #[test]
    fn the_place_a_plan_is_refused_is_set_apart() {
        let plan = br#"{"actions": [{"intent": "write_json", "path": "z.json", "data": {"a": 1, "a": 1}}]}"#;
        let why = parse_plan(plan).unwrap_err().reason;
        assert!(
            why.contains("give each key once (line 1, column ") && !why.contains(" at line "),
            "{why}"
        );
        let why = check_unique_keys(br#"{"a": 1, "a": 2}"#)
            .unwrap_err()
            .reason;
        assert!(why.contains("give each key once (line 1, column "), "{why}");
        // A value of the wrong type is named by its place, in words.
        let plan = br#"{"actions": [{"intent": "create_file", "path": "a.md", "content": 5}]}"#;
        let why = parse_plan(plan).unwrap_err().reason;
        assert!(
            why.contains(
                "'content' of action 1 must be a string, not a number (5) (line 1, column "
            ) && !why.contains("invalid type"),
            "{why}"
        );
    }

    /// `on_failure` of another type than a string is named with what it takes, not
    /// taken for a syntax error.
    #[test]
    fn on_failure_of_the_wrong_type_names_what_it_takes() {
        for (v, said) in [
            ("5", "not a number (5)"),
            ("true", "not a boolean (true)"),
            ("[]", "not an array"),
        ] {
            let plan = format!(r#"{{"on_failure": {v}, "actions": []}}"#);
            let why = parse_plan(plan.as_bytes()).unwrap_err().reason;
            assert!(
                why.contains(&format!(
                    "'on_failure' must be \"rollback\" or \"stop\", {said}"
                )),
                "{why}"
            );
        }
        let plan = br#"{"on_failure": "stop", "actions": []}"#;
        assert_eq!(parse_plan(plan).unwrap().on_failure, Some(OnFailure::Stop));
    }

    /// Data nested deep enough that its indentation alone would pass the file's limit is
    /// refused before it is rendered; a deep chain of few values is rendered as before.
    #[test]
    fn deep_data_is_refused_before_it_is_rendered() {
        let deep = |zeros: usize| {
            let inner = vec!["0"; zeros].join(",");
            format!("{}{inner}{}", "[".repeat(100), "]".repeat(100))
        };
        for (intent, ext) in [("write_json", "json"), ("write_yaml", "yaml")] {
            let op = crate::catalog::op_for_intent(intent).unwrap();
            let plan = |data: String| {
                parse_plan(
                    format!(
                        r#"{{"actions": [{{"intent": "{intent}", "path": "d.{ext}", "data": {data}}}]}}"#
                    )
                    .as_bytes(),
                )
                .unwrap()
            };
            let big = plan(deep(200_000));
            let why = render(op, &big.actions[0], &format!(".{ext}"), None).unwrap_err();
            assert_eq!(why.reason_code, ReasonCode::SizeExceeded, "{intent}");
            assert!(why.reason.contains("indentation"), "{}", why.reason);
            let small = plan(deep(3));
            let bytes = render(op, &small.actions[0], &format!(".{ext}"), None)
                .unwrap()
                .unwrap();
            assert!(bytes.len() < 64 * 1024, "{intent}: {}", bytes.len());
            // One string longer than the file may be is refused unrendered as well.
            let long = plan(format!("[\"{}\"]", "\\u007f".repeat(3 << 20)));
            let why = render(op, &long.actions[0], &format!(".{ext}"), None).unwrap_err();
            assert!(why.reason.contains("values and keys"), "{}", why.reason);
        }
        // What the check counts never passes what is rendered.
        let op = *crate::catalog::op_for_intent("write_json").unwrap();
        for data in [
            serde_json::json!({"a": [1, 2.5, 5e-324, true, null, "s\u{7f}\"", [], {}], "b": {"c": {"d": "e"}}}),
            serde_json::json!([[["deep", {"k": [0]}]], "x"]),
            serde_json::json!("plain"),
        ] {
            for rendered in [to_json(&data).unwrap(), to_yaml(&data).unwrap()] {
                let exact = Operation {
                    max_size_bytes: Some(rendered.len() as u64),
                    ..op
                };
                assert!(indented_fits(&exact, &data).is_ok(), "{data}");
            }
        }
    }

    /// TOML data whose tables' headers, each repeating the keys of its path, would pass
    /// the file's limit is refused before it is rendered; what the check counts never
    /// passes what is rendered, so data that fits is written as before.
    #[test]
    fn toml_headers_are_counted_before_rendering() {
        use serde_json::json;
        let op = *crate::catalog::op_for_intent("generate_config").unwrap();
        let long = "k".repeat(100 << 10);
        let tables: serde_json::Map<_, _> = (0..100)
            .map(|i| (format!("t{i}"), json!({"a": 0})))
            .collect();
        let elements = vec![json!({"a": 0}); 100];
        for data in [json!({ long.clone(): tables }), json!({ long: elements })] {
            let rendered = to_toml(&data).unwrap().len() as u64;
            assert!(rendered > 100 * (100 << 10), "{rendered}");
            let why = toml_headers_fit(&op, &data).unwrap_err();
            assert_eq!(why.reason_code, ReasonCode::SizeExceeded);
            assert!(why.reason.contains("headers"), "{}", why.reason);
        }
        // Floats are written out in full: 2000 of 5e-324 take 650 KiB.
        let tiny = json!({ "f": vec![5e-324; 2000] });
        assert!(to_toml(&tiny).unwrap().len() > 600 << 10);
        let why = toml_headers_fit(&op, &tiny).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::SizeExceeded);
        for data in [
            json!({"a": {"b": {"c": {"d": 1}, "e": {}}, "f": [{"g": {"h": 2}}, {}]}}),
            json!({"x": [1, {"y": 2}], "z": [[{"w": 3}]], "tables": [{"u": {"v": {}}}]}),
            json!({"top": 1, "s": {"t": {"u": {"v": {"w": [{"q": [{"r": 0}]}]}}}}}),
            json!({"f": [5e-324, 1e300, 0.1, -2.5, 7], "t": true, "e": [], "s": "a\u{7f}\"b",
                   "k y": {"m": [{"n": {"o": "p"}}, {"q": {}}], "in": [{"a": 1}, 2]}}),
        ] {
            let rendered = to_toml(&data).unwrap();
            let exact = Operation {
                max_size_bytes: Some(rendered.len() as u64),
                ..op
            };
            assert!(toml_headers_fit(&exact, &data).is_ok(), "{data}");
            let smaller = Operation {
                max_size_bytes: Some(8),
                ..op
            };
            assert!(toml_headers_fit(&smaller, &data).is_err(), "{data}");
        }
    }

    /// An action or an edit written as an array is refused, not read field by field in
    /// the order the source declares them.
    #[test]
    fn actions_and_edits_are_objects_not_arrays() {
        for (plan, said) in [
            (
                &br#"{"actions": [["a1", "create_file", "a.md", "x"]]}"#[..],
                "action 1 must be an object, not an array (line 1, column ",
            ),
            (
                br#"{"actions": [{"intent": "sandbox_transform", "path": "a.md", "edits": [["a", "b"]]}]}"#,
                "edit 1 of action 1 must be an object, not an array (line 1, column ",
            ),
            (
                br#"{"actions": [{"intent": "sandbox_transform", "path": "a.md", "edits": [{"old": "a", "new": "b"}, ["a", "b", 1]]}]}"#,
                "edit 2 of action 1 must be an object, not an array (line 1, column ",
            ),
        ] {
            let why = parse_plan(plan).unwrap_err();
            assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
            assert!(why.reason.contains(said), "{}", why.reason);
        }
        let plan = br#"{"actions": [{"intent": "sandbox_transform", "path": "a.md", "edits": [{"old": "a", "new": "b"}]}]}"#;
        assert_eq!(
            parse_plan(plan).unwrap().actions[0]
                .edits
                .as_ref()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_byte_order_mark_is_named() {
        let plan = b"\xEF\xBB\xBF{\"actions\": []}";
        let why = parse_plan(plan).unwrap_err();
        assert_eq!(why.reason_code, ReasonCode::InvalidPlan);
        assert!(why.reason.contains("byte order mark"), "{}", why.reason);
        let why = parse_plan(b"[]").unwrap_err().reason;
        assert!(!why.contains("byte order mark"), "{why}");
        let why = parse_plan(b"\xFF\xFE{\x00").unwrap_err().reason;
        assert!(why.contains("UTF-16 byte order mark"), "{why}");
        let why = parse_plan(b"\x80{}").unwrap_err().reason;
        assert!(why.contains("byte 0x80 at offset 0"), "{why}");
        let why = parse_plan(b"").unwrap_err().reason;
        assert!(
            why.ends_with("array (it is empty: nothing was read)"),
            "{why}"
        );
        let why = parse_plan(b" \n").unwrap_err().reason;
        assert!(why.contains("(it is empty but for white space"), "{why}");
    }

    #[test]
    fn numbers_that_survive_are_kept_and_others_are_named() {
        for kept in [
            "0",
            "-0.0",
            "42",
            "-9223372036854775808",
            "18446744073709551615",
            "3.14",
            "0.1",
            "1e3",
            "1E-7",
            "2.5e+10",
            "1e23",
            "1.7976931348623157e308",
        ] {
            assert!(number_is_kept(kept), "{kept}");
        }
        for changed in [
            "-0",
            "18446744073709551616",
            "-9223372036854775809",
            "100000000000000000000000",
            "20000000000000000000",
            "1180591620717411303424",
            "12345678901234567890123",
            "0.1000000000000000000001",
            "3.141592653589793238462643",
            "1e-400",
        ] {
            assert!(!number_is_kept(changed), "{changed}");
        }
    }

    /// Text that is not JSON is said in words, with what to write instead, whichever
    /// reader met it (the plan's, or the one for arguments parsed elsewhere).
    #[test]
    fn syntax_errors_are_said_in_words() {
        let content = |raw: &str| {
            format!(
                r#"{{"actions":[{{"intent":"create_file","path":"a.txt","content":"{raw}"}}]}}"#
            )
        };
        for (text, words) in [
            (
                content("a\tb"),
                "a string holds a raw control character (a tab",
            ),
            (
                content(r"a\qb"),
                "a backslash in a string starts no JSON escape",
            ),
            (
                r#"{"actions":[{"intent":"create_file" "path":"a.txt"}]}"#.to_owned(),
                "separated by ',' and the object is closed by '}': one of them is missing",
            ),
            (
                r#"{"actions":[{"intent":"create_file","path":"a.txt","content":+1}]}"#.to_owned(),
                "a value was expected here",
            ),
            (
                r#"{"actions":[{"intent":"create_file","path":"a.txt","content":nope}]}"#
                    .to_owned(),
                "a word is not JSON here",
            ),
        ] {
            let said = parse_plan(text.as_bytes()).unwrap_err().reason;
            assert!(said.contains(words), "{text}: {said}");
            assert!(said.contains("(line 1, column "), "{text}: {said}");
            let said = check_unique_keys(text.as_bytes()).unwrap_err().reason;
            assert!(said.contains(words), "{text}: {said}");
        }
    }

    /// A number beyond a double's range is named too (it was "number out of range at
    /// line 1 column 68").
    #[test]
    fn a_number_out_of_range_is_named() {
        for n in ["1e999", "-1e400"] {
            let plan = format!(
                r#"{{"actions":[{{"intent":"write_json","path":"a.json","data":{{"a":{n}}}}}]}}"#
            );
            let err = parse_plan(plan.as_bytes()).unwrap_err();
            assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
            assert!(
                err.reason.contains(&format!("the number {n} ")),
                "{}",
                err.reason
            );
        }
    }

    #[test]
    fn numbers_inside_strings_are_text() {
        assert!(check_numbers_kept(br#"{"a": "12345678901234567890123", "b\"": 1}"#).is_ok());
        let err = check_numbers_kept(br#"{"a": ["x\\", 12345678901234567890123]}"#).unwrap_err();
        assert_eq!(err.reason_code, ReasonCode::InvalidPlan);
        assert!(
            err.reason.contains("12345678901234567890123"),
            "{}",
            err.reason
        );
        assert!(err.reason.contains("string"), "{}", err.reason);
        // Minus zero is refused for what it is, not for its digits.
        let err = check_numbers_kept(br#"{"a": -0}"#).unwrap_err();
        assert!(
            err.reason.contains("-0.0") && !err.reason.contains("significant digits"),
            "{}",
            err.reason
        );
    }
}
