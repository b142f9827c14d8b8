//! How answers are shown: aligned tables for people, JSON or YAML for scripts.

use serde_json::Value;

/// `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// A table.
    #[default]
    Table,
    /// A table with more columns.
    Wide,
    /// The API's JSON.
    Json,
    /// The API's objects as YAML.
    Yaml,
}

/// Prints `value` as JSON or YAML; `false` for the table formats (the caller prints those).
pub fn structured(format: Format, value: &Value) -> bool {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(value).expect("JSON serializes")),
        Format::Yaml => print!("{}", serde_norway::to_string(value).expect("YAML serializes")),
        Format::Table | Format::Wide => return false,
    }
    true
}

/// Prints rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}   "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A JSON value as a cell: strings bare, absent as empty.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), gpus),
        other => other.to_string(),
    }
}

/// A number of GPUs: whole numbers without a fraction.
pub fn gpus(n: f64) -> String {
    // In hundredths: a sum of tenths (0.9999999999999999) says 1, not "1.".
    let n = (n * 100.0).round() / 100.0;
    if n.fract() == 0.0 { format!("{n:.0}") } else { format!("{n:.2}").trim_end_matches('0').to_owned() }
}

/// `n` GPUs, as said: `1 GPU`, `2 GPUs`, `0.5 GPUs`.
pub fn gpus_said(n: f64) -> String {
    let n = gpus(n);
    if n == "1" { "1 GPU".to_owned() } else { format!("{n} GPUs") }
}

/// How long ago (or from now) an RFC 3339 time is, as people say it.
pub fn age(t: &Value) -> String {
    let Some(t) = t.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok()) else { return String::new() };
    let secs = (chrono::Utc::now() - t.to_utc()).num_seconds();
    let (n, future) = (secs.unsigned_abs(), secs < 0);
    let text = match n {
        0..120 => format!("{n}s"),
        120..7200 => format!("{}m", n / 60),
        7200..172_800 => format!("{}h", n / 3600),
        _ => format!("{}d", n / 86_400),
    };
    if future { format!("in {text}") } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_numbers_read_as_people_say_them() {
        let ago = (chrono::Utc::now() - chrono::TimeDelta::minutes(5)).to_rfc3339();
        assert_eq!(age(&Value::String(ago)), "5m");
        let later = (chrono::Utc::now() + chrono::TimeDelta::hours(3) + chrono::TimeDelta::seconds(5)).to_rfc3339();
        assert_eq!(age(&Value::String(later)), "in 3h");
        assert_eq!(age(&Value::Null), "");
        assert_eq!(gpus(2.0), "2");
        assert_eq!(gpus(0.25), "0.25");
        assert_eq!(gpus(1.5), "1.5");
        // Ten tenths add up to 0.9999999999999999: one GPU, as said.
        let tenths = (0..10).map(|_| 0.1).fold(0.0, |a: f64, b| a + b);
        assert_eq!((gpus(tenths), gpus_said(tenths), gpus_said(2.0)), ("1".into(), "1 GPU".into(), "2 GPUs".into()));
    }
}
