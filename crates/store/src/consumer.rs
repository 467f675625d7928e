//! The outbox's consumers by name: the one list of them, for commands, keys,
//! metrics and logs.
//!
//! A consumer's name is part of stored keys (its cursor, its processed-message
//! entries) and of commands already in Raft logs, where it was written as a
//! string. So a `Consumer` serializes as exactly that string (not as an enum
//! variant index), and a name this release does not know does not decode.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A downstream consumer of `order.created` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Consumer {
    /// Reserves each order's item lines.
    Inventory,
    /// Charges the payment provider and records the result on the order.
    Payments,
}

impl Consumer {
    pub const ALL: [Consumer; 2] = [Consumer::Inventory, Consumer::Payments];

    /// The name in stored keys, commands, metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Consumer::Inventory => "inventory",
            Consumer::Payments => "payments",
        }
    }

    pub fn parse(name: &str) -> Option<Consumer> {
        Consumer::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl std::fmt::Display for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Consumer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Consumer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Consumer, D::Error> {
        let name = String::deserialize(deserializer)?;
        Consumer::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown consumer {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_plain, encode_plain};
    use crate::command::{Command, Processed};
    use keyhold_core::UnixMillis;

    #[test]
    fn a_consumer_has_the_wire_form_of_its_name_as_a_string() {
        for consumer in Consumer::ALL {
            let as_string = encode_plain(&consumer.as_str().to_owned());
            assert_eq!(encode_plain(&consumer), as_string);
            assert_eq!(decode_plain::<Consumer>(&as_string).unwrap(), consumer);
            assert_eq!(Consumer::parse(&consumer.to_string()), Some(consumer));
        }
        assert!(decode_plain::<Consumer>(&encode_plain(&"shipping".to_owned())).is_err());
        assert_eq!(Consumer::parse("Inventory"), None);
    }

    /// Commands in Raft logs and values in region trees written while consumer
    /// names were `String`s: their bytes, spelled out, still decode (and encode
    /// to the same bytes).
    #[test]
    fn commands_and_values_written_with_string_names_still_decode() {
        // bincode 2, standard config: the variant index, varints, and each
        // string as its length and bytes.
        let mut sweep = vec![4, 7, 100, 2, 9];
        sweep.extend_from_slice(b"inventory");
        sweep.push(8);
        sweep.extend_from_slice(b"payments");
        let decoded = Command::decode(&sweep).unwrap();
        assert_eq!(
            decoded,
            Command::Sweep {
                now: UnixMillis(7),
                entries_max: 100,
                consumers: vec![Consumer::Inventory, Consumer::Payments],
            }
        );
        assert_eq!(decoded.encode(), sweep);

        let mut advance = vec![8, 8];
        advance.extend_from_slice(b"payments");
        advance.extend_from_slice(&[42, 3]);
        let decoded = Command::decode(&advance).unwrap();
        assert_eq!(
            decoded,
            Command::AdvanceCursor {
                consumer: Consumer::Payments,
                seq: 42,
                generation: 3,
            }
        );
        assert_eq!(decoded.encode(), advance);

        let mut processed = vec![9];
        processed.extend_from_slice(b"inventory");
        processed.extend_from_slice(&[5]);
        processed.extend_from_slice(b"evt_1");
        processed.extend_from_slice(&[1, 2]);
        let value: Processed = decode_plain(&processed).unwrap();
        assert_eq!(value.consumer, Consumer::Inventory);
        assert_eq!(encode_plain(&value), processed);
    }
}
