//! Cursor pagination: lists are ordered by a stable key and continue after an opaque
//! cursor that encodes the last key returned.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Serialize, de::DeserializeOwned};

use crate::error::Error;

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 500;

/// The most bytes of objects one page of workloads carries: a page of large workloads
/// ends early (at least one item, and a `next` cursor), so no list call builds more than
/// about this much whatever `limit` says.
pub const PAGE_BYTES: i64 = 2 * 1024 * 1024;

/// A validated page request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest<K> {
    pub limit: u32,
    /// Continue strictly after this key.
    pub after: Option<K>,
}

impl<K: DeserializeOwned> PageRequest<K> {
    /// Builds a page request from the `limit` and `cursor` query parameters.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `limit` (outside 1..=500) or `cursor` (not one we issued).
    pub fn new(limit: Option<u32>, cursor: Option<&str>) -> Result<Self, Error> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Error::invalid("limit", format!("must be between 1 and {MAX_LIMIT}")));
        }
        // An empty cursor is no cursor: the first page.
        let after = cursor.filter(|c| !c.is_empty()).map(decode_cursor).transpose()?;
        Ok(Self { limit, after })
    }
}

/// Encodes a key as an opaque cursor.
pub fn encode_cursor<K: Serialize>(key: &K) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(key).expect("cursor keys serialize"))
}

fn decode_cursor<K: DeserializeOwned>(cursor: &str) -> Result<K, Error> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        // Keys are names: a NUL (which Postgres cannot store) was never in one we issued.
        .filter(|key| !key.to_string().contains("\\u0000"))
        .and_then(|key| serde_json::from_value(key).ok())
        .ok_or_else(|| Error::invalid("cursor", "is not a cursor: pass back a page's `next` as it came"))
}

/// One page of results plus the cursor of the next page, if there is one.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from up to `limit + 1` rows: the extra row only signals that more follow.
    pub fn from_rows<K: Serialize>(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> K) -> Self {
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let next = if more { rows.last().map(|last| encode_cursor(&key(last))) } else { None };
        Self { items: rows, next }
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page { items: self.items.into_iter().map(f).collect(), next: self.next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_garbage_is_rejected() {
        let c = encode_cursor(&("team".to_string(), "job".to_string()));
        let p = PageRequest::<(String, String)>::new(Some(10), Some(&c)).unwrap();
        assert_eq!(p.after, Some(("team".into(), "job".into())));
        assert!(PageRequest::<(String, String)>::new(None, Some("!!")).is_err());
        assert!(PageRequest::<String>::new(Some(0), None).is_err());
        assert!(PageRequest::<String>::new(Some(501), None).is_err());
        let nul = encode_cursor(&("team\0".to_string(), "job".to_string()));
        assert!(PageRequest::<(String, String)>::new(None, Some(&nul)).is_err());
    }

    #[test]
    fn extra_row_yields_a_next_cursor() {
        let page = Page::from_rows(vec![1, 2, 3], 2, |n| *n);
        assert_eq!(page.items, vec![1, 2]);
        assert_eq!(page.next, Some(encode_cursor(&2)));
        assert!(Page::from_rows(vec![1, 2], 2, |n| *n).next.is_none());
    }
}
