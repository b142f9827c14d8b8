//! A deserializer that reads a struct only from a JSON object.
//!
//! serde's derived structs also accept a JSON array of their fields in order (`["ci",
//! null, "x"]` for `{"name": "ci", "team": null, "description": "x"}`), which no client
//! means and the OpenAPI document does not allow; `deny_unknown_fields` does not stop it.
//! [`Strict`] wraps a deserializer so that every struct, at any depth, is asked for as a
//! map: an array where an object belongs is then a type error naming the field.
//!
//! It also reads a number written with a zero fraction (`8.0`) as the integer it is, as
//! JSON Schema's `integer` does, so that a whole-number field takes every JSON number the
//! document allows for it.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

/// Wraps a deserializer (and, through its visitors, every nested one).
pub struct Strict<D>(pub D);

struct StrictVisitor<V>(V);
struct StrictSeed<S>(S);
struct StrictSeq<A>(A);
struct StrictMap<A>(A);
struct StrictEnum<A>(A);
struct StrictVariant<A>(A);

macro_rules! forward {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(StrictVisitor(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<D> {
    type Error = D::Error;

    forward! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64 deserialize_char deserialize_str deserialize_string deserialize_bytes
        deserialize_byte_buf deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, StrictVisitor(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, StrictVisitor(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, StrictVisitor(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, StrictVisitor(visitor))
    }

    /// The point of this module: a struct is read from a map, never from a sequence.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(StrictVisitor(NoSeq(visitor)))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, StrictVisitor(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// A struct's visitor that refuses the sequence form even if a deserializer offers it.
struct NoSeq<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for NoSeq<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(map)
    }
}

macro_rules! visit_value {
    ($($method:ident: $ty:ty)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.0.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for StrictVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    visit_value! {
        visit_bool: bool visit_i8: i8 visit_i16: i16 visit_i32: i32 visit_i64: i64 visit_i128: i128
        visit_u8: u8 visit_u16: u16 visit_u32: u32 visit_u64: u64 visit_u128: u128 visit_f32: f32
        visit_char: char visit_str: &str visit_borrowed_str: &'de str visit_string: String visit_bytes: &[u8]
        visit_borrowed_bytes: &'de [u8] visit_byte_buf: Vec<u8>
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        // Exactly representable whole numbers only (|v| < 2^53); a float field accepts
        // the integer as well.
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if v.fract() == 0.0 && v.abs() < EXACT {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return if v >= 0.0 { self.0.visit_u64(v as u64) } else { self.0.visit_i64(v as i64) };
        }
        self.0.visit_f64(v)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_some(Strict(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_newtype_struct(Strict(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(StrictSeq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(StrictMap(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.0.visit_enum(StrictEnum(data))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for StrictSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(Strict(d))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for StrictSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for StrictMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(StrictSeed(seed))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for StrictEnum<A> {
    type Error = A::Error;
    type Variant = StrictVariant<A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self::Variant), A::Error> {
        self.0.variant_seed(StrictSeed(seed)).map(|(value, variant)| (value, StrictVariant(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for StrictVariant<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(StrictSeed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, StrictVisitor(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, StrictVisitor(NoSeq(visitor)))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::Strict;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        name: String,
        #[serde(default)]
        inner: Option<Inner>,
        list: Vec<Inner>,
    }

    fn parse(text: &str) -> Result<Outer, serde_json::Error> {
        Outer::deserialize(Strict(&mut serde_json::Deserializer::from_str(text)))
    }

    #[test]
    fn objects_parse_and_arrays_in_place_of_objects_do_not() {
        let ok = parse(r#"{"name": "x", "inner": {"a": 1}, "list": [{"a": 2}]}"#).unwrap();
        assert_eq!(ok.list, vec![Inner { a: 2 }]);
        assert!(parse(r#"["x", null, []]"#).is_err(), "the top level");
        assert!(parse(r#"{"name": "x", "inner": [1], "list": []}"#).is_err(), "inside an option");
        assert!(parse(r#"{"name": "x", "list": [[2]]}"#).is_err(), "inside a list");
    }

    #[test]
    fn whole_numbers_written_with_a_fraction_are_integers() {
        let ok = parse(r#"{"name": "x", "list": [{"a": 2622.0}]}"#).unwrap();
        assert_eq!(ok.list, vec![Inner { a: 2622 }]);
        assert!(parse(r#"{"name": "x", "list": [{"a": 2.5}]}"#).is_err());
        assert!(parse(r#"{"name": "x", "list": [{"a": -1.0}]}"#).is_err(), "still in range of the type");
        let gpus: f64 = f64::deserialize(Strict(&mut serde_json::Deserializer::from_str("8.0"))).unwrap();
        assert!((gpus - 8.0).abs() < f64::EPSILON);
    }
}
