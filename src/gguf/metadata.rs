//! The metadata of one GGUF file and its typed accessors.
//!
//! Accessors refuse a value of another type rather than converting it,
//! naming the key and the type found (`key "olmoe.expert_count" is string,
//! expected u32`), except [`Metadata::get_count`] and
//! [`Metadata::get_float`]: writers disagree on the integer width of counts
//! and ids (u32, i32, u64) and on f32 against f64, and a config needs the
//! number, not the width.

use std::collections::HashMap;

use super::GgufError;
use super::value::{Array, Value, f32_as_decimal};

/// Keys and values in file order, with an index by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! strict_getter {
    ($name:ident, $variant:ident, $t:ty, $expected:literal) => {
        #[doc = concat!("The ", $expected, " value of `key`.")]
        pub fn $name(&self, key: &str) -> Result<$t, GgufError> {
            match self.require(key)? {
                Value::$variant(v) => Ok(*v),
                other => Err(wrong_type(key, $expected, other)),
            }
        }
    };
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::KeyType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

impl Metadata {
    /// Adds an entry; a key seen before is refused (which of two values a
    /// reader would take is not defined).
    pub(crate) fn insert(&mut self, key: String, value: Value) -> Result<(), GgufError> {
        let n = self.entries.len();
        if let Some(&first) = self.index.get(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                first: first as u64,
                second: n as u64,
            });
        }
        self.index.insert(key.clone(), n);
        self.entries.push((key, value));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index
            .get(key)
            .and_then(|&i| self.entries.get(i))
            .map(|e| &e.1)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    strict_getter!(get_u8, U8, u8, "u8");
    strict_getter!(get_i8, I8, i8, "i8");
    strict_getter!(get_u16, U16, u16, "u16");
    strict_getter!(get_i16, I16, i16, "i16");
    strict_getter!(get_u32, U32, u32, "u32");
    strict_getter!(get_i32, I32, i32, "i32");
    strict_getter!(get_u64, U64, u64, "u64");
    strict_getter!(get_i64, I64, i64, "i64");
    strict_getter!(get_f32, F32, f32, "f32");
    strict_getter!(get_f64, F64, f64, "f64");
    strict_getter!(get_bool, Bool, bool, "bool");

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(wrong_type(key, "string", other)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(wrong_type(key, "array", other)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            other => Err(wrong_type(key, "array of string", other)),
        }
    }

    /// A count or id stored as any integer type, as a `usize`; negative
    /// values and values above `usize::MAX` are refused by name.
    pub fn get_count(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.require(key)?;
        let Some(n) = v.as_i128() else {
            return Err(wrong_type(key, "an integer", v));
        };
        usize::try_from(n).map_err(|_| GgufError::key(key, format!("{n} is not a valid count")))
    }

    /// A number stored as f32 (read back as the decimal it was written
    /// from, [`f32_as_decimal`]) or f64.
    pub fn get_float(&self, key: &str) -> Result<f64, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(f32_as_decimal(*v)),
            Value::F64(v) => Ok(*v),
            other => Err(wrong_type(key, "f32 or f64", other)),
        }
    }
}

/// `Ok(None)` for a missing key, so optional keys read as
/// `optional(meta.get_u32(k))?` while a present key of the wrong type is
/// still an error.
pub fn optional<T>(r: Result<T, GgufError>) -> Result<Option<T>, GgufError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(GgufError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Metadata {
        let mut m = Metadata::default();
        m.insert("a.count".into(), Value::U32(8)).unwrap();
        m.insert("a.name".into(), Value::String("olmoe".into())).unwrap();
        m.insert("a.eps".into(), Value::F32(1e-5)).unwrap();
        m.insert("a.neg".into(), Value::I32(-1)).unwrap();
        m.insert("a.list".into(), Value::Array(Array::String(vec!["x".into()])))
            .unwrap();
        m
    }

    #[test]
    fn accessors_name_the_key_and_the_type_found() {
        let m = meta();
        assert_eq!(m.get_u32("a.count").unwrap(), 8);
        assert_eq!(m.get_str("a.name").unwrap(), "olmoe");
        assert_eq!(m.get_float("a.eps").unwrap(), 1e-5);
        assert_eq!(m.get_count("a.count").unwrap(), 8);
        assert_eq!(m.get_str_array("a.list").unwrap(), ["x"]);
        let e = m.get_u32("a.name").unwrap_err().to_string();
        assert_eq!(e, "key \"a.name\" is string, expected u32");
        let e = m.get_str("a.list").unwrap_err().to_string();
        assert_eq!(e, "key \"a.list\" is array of string, expected string");
        let e = m.get_count("a.neg").unwrap_err().to_string();
        assert!(e.contains("a.neg") && e.contains("-1"), "{e}");
        let e = m.get_u32("a.none").unwrap_err().to_string();
        assert_eq!(e, "key \"a.none\" not found");
        assert_eq!(optional(m.get_u32("a.none")).unwrap(), None);
        assert!(optional(m.get_u32("a.name")).is_err());
    }

    #[test]
    fn a_duplicate_key_is_refused_with_both_positions() {
        let mut m = meta();
        let e = m
            .insert("a.name".into(), Value::Bool(true))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "duplicate key \"a.name\" (metadata entries #1 and #5)");
    }
}
