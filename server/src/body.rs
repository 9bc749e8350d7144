//! A proxied request's body, read once for every wire (docs/proxy.md#what-goes-upstream):
//! an object's members in their order, each value as its raw JSON text borrowed from the
//! body, without building a `Value` of the whole; the one member a wire splits (chat's and
//! Anthropic's `messages`) is split into its elements' texts in the same pass. Every other
//! member goes upstream as these bytes ([`forwarded_body`]).

use axum::body::Bytes;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// A body: an object's members, or any other JSON value.
pub(crate) enum RequestBody<'a> {
    Object(Members<'a>),
    Other,
}

/// One member: its name and its value's raw JSON text; `None` for the split member,
/// whose value is in [`Members::split`].
pub(crate) type Member<'a> = (String, Option<&'a RawValue>);

pub(crate) struct Members<'a> {
    /// Every member in its place.
    pub(crate) members: Vec<Member<'a>>,
    /// The split member's value, when present.
    pub(crate) split: Option<Elements<'a>>,
}

impl<'a> Members<'a> {
    /// A member's raw text (never the split one's).
    pub(crate) fn member(&self, name: &str) -> Option<&'a RawValue> {
        member(&self.members, name)
    }
}

/// A member's raw text in `members`.
pub(crate) fn member<'a>(members: &[Member<'a>], name: &str) -> Option<&'a RawValue> {
    members
        .iter()
        .find(|(key, _)| key == name)
        .and_then(|(_, raw)| *raw)
}

/// The split member's value: each element's JSON text, or a value of another kind.
pub(crate) enum Elements<'a> {
    Array(Vec<&'a RawValue>),
    Other,
}

impl<'a> RequestBody<'a> {
    /// Reads `bytes`, splitting the member named `split` (none: every member raw).
    pub(crate) fn read(bytes: &'a [u8], split: Option<&'static str>) -> serde_json::Result<RequestBody<'a>> {
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let body = Body { split }.deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(body)
    }
}

/// The visitor methods of every JSON value but an object or array, each answering `$other`.
macro_rules! other_values {
    ($other:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

/// The reader of a body, knowing which member to split.
struct Body {
    split: Option<&'static str>,
}

impl<'de> DeserializeSeed<'de> for Body {
    type Value = RequestBody<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Body {
    type Value = RequestBody<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<Member<'de>> = Vec::new();
        let mut split = None;
        while let Some(key) = map.next_key::<String>()? {
            let value = if Some(key.as_str()) == self.split {
                split = Some(map.next_value_seed(Split)?);
                None
            } else {
                Some(map.next_value::<&'de RawValue>()?)
            };
            // A repeated key: the last value in the first one's place, as a
            // `serde_json::Map` (preserve_order) reads it.
            match members.iter_mut().find(|(k, _)| *k == key) {
                Some(member) => member.1 = value,
                None => members.push((key, value)),
            }
        }
        Ok(RequestBody::Object(Members { members, split }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(RequestBody::Other)
    }

    other_values!(RequestBody::Other);
}

/// The reader of the split member's value.
struct Split;

impl<'de> DeserializeSeed<'de> for Split {
    type Value = Elements<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Split {
    type Value = Elements<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut elements = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(element) = seq.next_element::<&'de RawValue>()? {
            elements.push(element);
        }
        Ok(Elements::Array(elements))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Elements::Other)
    }

    other_values!(Elements::Other);
}

/// The body sent upstream: `members` in their order and as their bytes came, each member
/// `replace` names given the text it pairs with it (its JSON text; `None`: the member is
/// left out), and the split member (`None` in `members`) given `split`.
pub(crate) fn forwarded_body(members: &[Member<'_>], split: &str, replace: &[(&str, Option<&str>)]) -> Bytes {
    let size = members
        .iter()
        .map(|(key, raw)| key.len() + raw.map_or(0, |raw| raw.get().len()) + 4)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size + split.len());
    out.push(b'{');
    for (key, raw) in members {
        let value = match (replace.iter().find(|(name, _)| name == key), raw) {
            (Some((_, Some(text))), _) => *text,
            (Some((_, None)), _) => continue,
            (None, None) => split,
            (None, Some(raw)) => raw.get(),
        };
        if out.len() > 1 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key).expect("writing to a Vec cannot fail");
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'}');
    Bytes::from(out)
}

/// `body` (a JSON object's text, as [`forwarded_body`] writes it) with the member `key`
/// (its value's JSON text `value`) added first or last.
pub(crate) fn add_member(body: &[u8], key: &str, value: &str, first: bool) -> Bytes {
    let mut member = serde_json::to_vec(key).expect("writing to a Vec cannot fail");
    member.push(b':');
    member.extend_from_slice(value.as_bytes());
    let inner = &body[1..body.len() - 1];
    let mut out = Vec::with_capacity(body.len() + member.len() + 1);
    out.push(b'{');
    match (first, inner.is_empty()) {
        (_, true) => out.extend_from_slice(&member),
        (true, false) => {
            out.extend_from_slice(&member);
            out.push(b',');
            out.extend_from_slice(inner);
        }
        (false, false) => {
            out.extend_from_slice(inner);
            out.push(b',');
            out.extend_from_slice(&member);
        }
    }
    out.push(b'}');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn members<'a>(body: &'a str, split: Option<&'static str>) -> Vec<Member<'a>> {
        match RequestBody::read(body.as_bytes(), split) {
            Ok(RequestBody::Object(body)) => body.members,
            Ok(RequestBody::Other) => panic!("not an object: {body}"),
            Err(e) => panic!("{body}: {e}"),
        }
    }

    #[test]
    fn the_forwarded_body_keeps_every_other_member_as_its_bytes_came_in_its_place() {
        let body = r#"{"model":"m", "temperature": 0.20, "messages":[{"role":"user","content":"a"}],"tools":[{"x":1e2}] ,"z":null}"#;
        let sent = r#"[{"role":"user","content":"b"}]"#;
        let forwarded = forwarded_body(&members(body, Some("messages")), sent, &[]);
        assert_eq!(
            std::str::from_utf8(&forwarded).unwrap(),
            r#"{"model":"m","temperature":0.20,"messages":[{"role":"user","content":"b"}],"tools":[{"x":1e2}],"z":null}"#
        );
    }

    #[test]
    fn replaced_members_take_their_place_and_a_dropped_one_is_left_out() {
        let body =
            r#"{"model":"m", "instructions":"be", "input":[{"type":"x"}], "store": false ,"z":{"a":1.50}}"#;
        let all = members(body, None);
        let forwarded = forwarded_body(
            &all,
            "",
            &[("input", Some("[]")), ("instructions", Some(r#""be!""#))],
        );
        assert_eq!(
            std::str::from_utf8(&forwarded).unwrap(),
            r#"{"model":"m","instructions":"be!","input":[],"store":false,"z":{"a":1.50}}"#
        );
        let forwarded = forwarded_body(&all, "", &[("instructions", None), ("model", None)]);
        assert_eq!(
            std::str::from_utf8(&forwarded).unwrap(),
            r#"{"input":[{"type":"x"}],"store":false,"z":{"a":1.50}}"#
        );
    }

    #[test]
    fn a_member_is_added_first_or_last() {
        assert_eq!(&add_member(b"{}", "s", "1", true)[..], br#"{"s":1}"#);
        assert_eq!(
            &add_member(br#"{"a":2}"#, "s", "1", true)[..],
            br#"{"s":1,"a":2}"#
        );
        assert_eq!(
            &add_member(br#"{"a":2}"#, "s", "1", false)[..],
            br#"{"a":2,"s":1}"#
        );
    }

    #[test]
    fn a_repeated_member_is_read_as_serde_json_reads_it() {
        let body = r#"{"a":1,"messages":[],"a":{"b":2},"k\"ey":"v"}"#;
        let ours =
            String::from_utf8(forwarded_body(&members(body, Some("messages")), "[]", &[]).to_vec()).unwrap();
        let theirs: Value = serde_json::from_str(body).unwrap();
        assert_eq!(ours, theirs.to_string());
        let ours = String::from_utf8(forwarded_body(&members(body, None), "", &[]).to_vec()).unwrap();
        assert_eq!(ours, theirs.to_string());
    }

    #[test]
    fn a_body_that_is_no_object_or_no_json_is_told_apart() {
        for split in [Some("messages"), None] {
            for other in ["[1, [2, {}]]", "\"text\"", "3", "-3", "1.5", "true", "null"] {
                assert!(
                    matches!(RequestBody::read(other.as_bytes(), split), Ok(RequestBody::Other)),
                    "{other}"
                );
            }
            for bad in ["", "{", "{\"a\":}", "{} {}", "{\"messages\":[1,]}"] {
                assert!(RequestBody::read(bad.as_bytes(), split).is_err(), "{bad}");
            }
        }
    }

    #[test]
    fn the_split_member_is_its_elements_or_another_value() {
        let body = r#"{"messages": [ {"a":1} , 2 ]}"#;
        let Ok(RequestBody::Object(read)) = RequestBody::read(body.as_bytes(), Some("messages")) else {
            panic!("an object")
        };
        match &read.split {
            Some(Elements::Array(elements)) => {
                let texts: Vec<&str> = elements.iter().map(|e| e.get()).collect();
                assert_eq!(texts, [r#"{"a":1}"#, "2"]);
            }
            _ => panic!("an array"),
        }
        assert!(read.member("messages").is_none());
        let Ok(RequestBody::Object(read)) = RequestBody::read(br#"{"messages":{"a":1}}"#, Some("messages"))
        else {
            panic!("an object")
        };
        assert!(matches!(read.split, Some(Elements::Other)));
    }
}
