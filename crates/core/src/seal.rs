//! Seals on the records the runtime keeps inside the roots (snapshot metadata, restore
//! marks). Those folders sit where agents and other programs may write directly, so a
//! record there is trusted only if it carries an HMAC-SHA-256 made with a key that lives in
//! the state directory: a snapshot planted in `.rollback/` by anyone who cannot read that
//! key is never restored, finished or audited.
//!
//! A rollback refuses a workflow with a record that fails its seal (`checksum_mismatch`,
//! naming the file), and recovery leaves such a record alone: a planted snapshot can
//! neither restore bytes, nor finish a commit, nor add a registry entry or an audit line.
//! Snapshot folders without a seal (written before seals existed) are refused like forged
//! ones.

use crate::hash::to_hex;
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::Sha256;
use std::fmt;
use std::io;

/// The key's file in the state directory.
pub const KEY_FILE: &str = "seal.key";
/// The field that carries the seal.
const SEAL_FIELD: &str = "seal";

/// The key records are sealed with.
#[derive(Clone)]
pub struct SealKey([u8; 32]);

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// Why a record was not accepted.
#[derive(Debug)]
pub enum Unsealed {
    /// Not JSON, or not the expected shape.
    Malformed(String),
    /// No seal, or one this key did not make.
    Forged,
}

impl SealKey {
    /// A key from its bytes.
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    fn mac(&self, canonical: &[u8]) -> Hmac<Sha256> {
        // A key shorter than SHA-256's 64-byte block is zero-padded to it by HMAC itself.
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(&self.0);
        let mut mac = <Hmac<Sha256> as KeyInit>::new(&block.into());
        mac.update(canonical);
        mac
    }

    /// `value` as JSON with a last field `seal`: the MAC of its compact JSON, which is
    /// the file's own text up to that field. `T` must serialize the same way each time (no
    /// hash maps), since [`SealKey::open`] serializes what it read again to check the seal.
    pub fn seal<T: Serialize>(&self, value: &T) -> io::Result<Vec<u8>> {
        let mut out = serde_json::to_vec(value).map_err(io::Error::other)?;
        let tag = to_hex(&self.mac(&out).finalize().into_bytes());
        if out.last() != Some(&b'}') {
            return Err(io::Error::other("only objects are sealed"));
        }
        out.pop();
        if out.last() != Some(&b'{') {
            out.push(b',');
        }
        out.extend_from_slice(format!("\"{SEAL_FIELD}\":\"{tag}\"}}\n").as_bytes());
        Ok(out)
    }

    /// The record in `bytes`, if its seal is this key's MAC of the record as `T`
    /// serializes it: any field changed, added or removed breaks it, whatever the layout.
    pub fn open<T: Serialize + DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, Unsealed> {
        let mut v: Value =
            serde_json::from_slice(bytes).map_err(|e| Unsealed::Malformed(e.to_string()))?;
        let Value::Object(map) = &mut v else {
            return Err(Unsealed::Malformed("not a JSON object".to_owned()));
        };
        let Some(Value::String(tag)) = map.remove(SEAL_FIELD) else {
            return Err(Unsealed::Forged);
        };
        let tag = unhex(&tag).ok_or(Unsealed::Forged)?;
        let record: T =
            serde_json::from_value(v).map_err(|e| Unsealed::Malformed(e.to_string()))?;
        let canonical =
            serde_json::to_vec(&record).map_err(|e| Unsealed::Malformed(e.to_string()))?;
        self.mac(&canonical)
            .verify_slice(&tag)
            .map_err(|_| Unsealed::Forged)?;
        Ok(record)
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed step is a failed test
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rec {
        path: String,
        size: u64,
        tags: std::collections::BTreeMap<String, String>,
    }

    fn rec() -> Rec {
        Rec {
            path: "notes/a.md".into(),
            size: 12,
            tags: (0..20)
                .map(|i| (format!("k{i}"), format!("v{i}")))
                .collect(),
        }
    }

    fn bytes_of(key: &SealKey) -> Vec<u8> {
        key.seal(&rec()).unwrap()
    }

    #[test]
    fn a_sealed_record_opens_with_its_key_only() {
        let key = SealKey::new([7; 32]);
        let bytes = key.seal(&rec()).unwrap();
        assert_eq!(key.open::<Rec>(&bytes).unwrap(), rec());
        assert!(matches!(
            SealKey::new([8; 32]).open::<Rec>(&bytes),
            Err(Unsealed::Forged)
        ));
    }

    #[test]
    fn any_change_or_a_missing_seal_is_forged() {
        let key = SealKey::new([7; 32]);
        let bytes = key.seal(&rec()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        let changed = text.replace("notes/a.md", "notes/b.md");
        assert!(matches!(
            key.open::<Rec>(changed.as_bytes()),
            Err(Unsealed::Forged)
        ));
        let unsealed = serde_json::to_vec(&rec()).unwrap();
        assert!(matches!(key.open::<Rec>(&unsealed), Err(Unsealed::Forged)));
        assert!(matches!(
            key.open::<Rec>(b"[1]"),
            Err(Unsealed::Malformed(_))
        ));
        // A field the record type ignores still counts when the record is a plain value.
        let mut v: Value = serde_json::from_slice(&bytes_of(&key)).unwrap();
        v["extra"] = Value::Bool(true);
        assert!(matches!(
            key.open::<Value>(&serde_json::to_vec(&v).unwrap()),
            Err(Unsealed::Forged)
        ));
    }

    #[test]
    fn values_and_empty_objects_are_sealed_too() {
        let key = SealKey::new([3; 32]);
        let v = serde_json::json!({"execution_id": "exec_1", "restored_checksum": null});
        assert_eq!(key.open::<Value>(&key.seal(&v).unwrap()).unwrap(), v);
        let empty = serde_json::json!({});
        assert_eq!(
            key.open::<Value>(&key.seal(&empty).unwrap()).unwrap(),
            empty
        );
        assert!(key.seal(&1).is_err());
    }

    #[test]
    fn reformatting_keeps_the_seal_valid() {
        // The seal covers the content, not the layout: a record re-indented by a tool
        // still opens.
        let key = SealKey::new([1; 32]);
        let bytes = key.seal(&rec()).unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let compact = serde_json::to_vec(&v).unwrap();
        assert_eq!(key.open::<Rec>(&compact).unwrap(), rec());
    }
}
