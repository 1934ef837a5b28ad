//! Any JSON value as a plan's `data`: what `write_json`, `write_yaml` and
//! `generate_config` write of it (JSON, YAML, TOML) reads back as the value sent, or the
//! action is refused; never a file that reads as other data.
#![no_main]

use ailab_sandbox_core::catalog::op_for_intent;
use ailab_sandbox_core::confine::normalize_extension;
use ailab_sandbox_core::plan::{parse_plan, render};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const WRITES: [(&str, &str); 6] = [
    ("write_json", "a.json"),
    ("write_yaml", "a.yaml"),
    ("generate_config", "a.json"),
    ("generate_config", "a.yaml"),
    ("generate_config", "a.yml"),
    ("generate_config", "a.toml"),
];

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for (intent, path) in WRITES {
        let plan = serde_json::json!({"actions": [{"intent": intent, "path": path, "data": value}]});
        let text = serde_json::to_vec(&plan).expect("a plan's text");
        let Ok(plan) = parse_plan(&text) else { return };
        let Ok(valid) = plan.validate() else { return };
        let action = &valid.actions()[0];
        let sent = action.data.as_ref().unwrap_or(&Value::Null);
        let op = op_for_intent(intent).expect("a write");
        let ext = normalize_extension(path);
        let Ok(Some(bytes)) = render(op, action, &ext, None) else {
            continue;
        };
        let written = std::str::from_utf8(&bytes).expect("a data file is text");
        let back: Value = match ext.as_str() {
            ".json" => serde_json::from_str(written).expect("JSON reads back"),
            ".toml" => toml::from_str(written).expect("TOML reads back"),
            _ => yaml_serde::from_str(written).expect("YAML reads back"),
        };
        assert!(
            same(&back, sent),
            "{intent} {path}: sent {sent}, written\n{written}\nread back {back}"
        );
    }
});

/// Equal values, numbers compared as numbers (`1.0` and `1` written as YAML's `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || (x.as_f64().is_some() && x.as_f64() == y.as_f64() && x.is_f64() == y.is_f64())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
