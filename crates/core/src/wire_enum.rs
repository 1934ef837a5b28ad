//! Enums whose values travel by name (reason codes, statuses, states): each variant's
//! wire name is written once, beside the variant, and the list of every value, `as_str`,
//! `Display` and serde all come from it, so they cannot disagree.

/// Defines a field-less enum from `Variant = "wire_name",` lines, with `ALL` (in the
/// order written), `as_str`, `from_wire`, `Display`, and serde as the wire name (an
/// unknown name is refused with serde's `unknown variant` words, as a derive would).
/// Derives and docs are passed through as written.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: [Self; [$($wire),+].len()] = [$(Self::$variant),+];

            /// Its wire name, e.g. `rolled_back`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $wire,)+
                }
            }

            /// The value whose wire name is `name`.
            pub fn from_wire(name: &str) -> Option<Self> {
                match name {
                    $($wire => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        // Padded as a string is (`{:<9}` lines up a listing's columns).
        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Named;
                impl ::serde::de::Visitor<'_> for Named {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                        f.write_str(concat!("one of the names of ", stringify!($name)))
                    }
                    fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        $name::from_wire(v).ok_or_else(|| E::unknown_variant(v, &[$($wire),+]))
                    }
                }
                d.deserialize_str(Named)
            }
        }
    };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    wire_enum! {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Sample {
            One = "one",
            TwoWords = "two_words",
        }
    }

    #[test]
    fn each_value_travels_by_its_name_and_back() {
        assert_eq!(Sample::ALL, [Sample::One, Sample::TwoWords]);
        for v in Sample::ALL {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{v}\""));
            assert_eq!(serde_json::from_str::<Sample>(&json).unwrap(), v);
            assert_eq!(Sample::from_wire(v.as_str()), Some(v));
        }
        assert_eq!(Sample::TwoWords.as_str(), "two_words");
        let err = serde_json::from_str::<Sample>("\"TwoWords\"").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown variant `TwoWords`, expected `one` or `two_words` at line 1 column 10"
        );
        let err = serde_json::from_str::<Sample>("2").unwrap_err();
        assert!(
            err.to_string().starts_with("invalid type: integer `2`"),
            "{err}"
        );
        assert_eq!(Sample::from_wire("three"), None);
    }

    #[test]
    fn a_value_is_padded_as_its_name_would_be() {
        assert_eq!(
            format!("{:<5}|{:>5}", Sample::One, Sample::One),
            "one  |  one"
        );
    }
}
