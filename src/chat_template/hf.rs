//! What Hugging Face's chat-template environment adds to Jinja, for
//! minijinja: the globals `raise_exception` and `strftime_now`, and its own
//! `tojson` filter (Python's `json.dumps`, not Jinja's HTML-safe one).
//!
//! transformers (`utils/chat_template_utils.py`) renders templates in a
//! sandboxed Jinja environment with `trim_blocks`, `lstrip_blocks` and the
//! loop-controls extension (`{% break %}`, `{% continue %}`: minijinja's
//! `loop_controls` feature), registers `raise_exception(message)` and
//! `strftime_now(format)` (`datetime.now().strftime(format)`) as globals, and
//! replaces `tojson` by
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! Python's separators are `", "` and `": "` (`","` and `": "` when
//! indenting), with no HTML escaping, so minijinja's built-in `tojson`
//! (compact, `<` written `\u003c`) would render tool schemas differently
//! from what the model was trained on.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// The render-context variable holding the render's clock reading (seconds
/// since the Unix epoch), so one render (or one [`super::ChatTemplate::render_turn`],
/// which renders twice) sees one date.
pub(crate) const NOW_VAR: &str = "__colibri_now_unix";

pub(crate) fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised: {msg}"),
    ))
}

/// Seconds since the Unix epoch (negative before it).
pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    }
}

/// `strftime_now(format)`: the render's clock (UTC) formatted like Python's
/// `strftime`.
pub(crate) fn strftime_now(state: &State, format: String) -> Result<String, Error> {
    let now = state
        .lookup(NOW_VAR)
        .and_then(|v| v.as_i64())
        .unwrap_or_else(|| unix_seconds(SystemTime::now()));
    strftime(now, &format)
}

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: u32, // 0 = Sunday
    yday: u32,    // 1..=366
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn civil(unix: i64) -> Civil {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as u32,
        yday,
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Python's `time.strftime` (C locale) for the directives templates use:
/// `%Y %y %C %m %d %e %j %H %I %M %S %p %a %A %b %h %B %u %w %F %D %T %R %Z
/// %z %n %t %%`. Any other directive is an error naming it, rather than
/// text the model was never shown.
pub(crate) fn strftime(unix: i64, format: &str) -> Result<String, Error> {
    let t = civil(unix);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("strftime_now: {format:?} ends with a lone '%'"),
            ));
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        match d {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => out.push_str(&format!("{:02}", t.year.rem_euclid(100))),
            'C' => out.push_str(&format!("{:02}", t.year.div_euclid(100))),
            'm' => out.push_str(&format!("{:02}", t.month)),
            'd' => out.push_str(&format!("{:02}", t.day)),
            'e' => out.push_str(&format!("{:2}", t.day)),
            'j' => out.push_str(&format!("{:03}", t.yday)),
            'H' => out.push_str(&format!("{:02}", t.hour)),
            'I' => out.push_str(&format!("{hour12:02}")),
            'M' => out.push_str(&format!("{:02}", t.minute)),
            'S' => out.push_str(&format!("{:02}", t.second)),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'a' => out.push_str(&DAYS[t.weekday as usize][..3]),
            'A' => out.push_str(DAYS[t.weekday as usize]),
            'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            'B' => out.push_str(MONTHS[t.month as usize - 1]),
            'u' => out.push_str(&(if t.weekday == 0 { 7 } else { t.weekday }).to_string()),
            'w' => out.push_str(&t.weekday.to_string()),
            'F' => out.push_str(&format!("{}-{:02}-{:02}", t.year, t.month, t.day)),
            'D' => out.push_str(&format!(
                "{:02}/{:02}/{:02}",
                t.month,
                t.day,
                t.year.rem_euclid(100)
            )),
            'T' => out.push_str(&format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second)),
            'R' => out.push_str(&format!("{:02}:{:02}", t.hour, t.minute)),
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other} in {format:?}"),
                ));
            }
        }
    }
    Ok(out)
}

/// How `tojson` lays JSON out (Python's `json.dumps` arguments).
struct JsonStyle {
    ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: a newline and `s` per nesting level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// as transformers defines it: `json.dumps` with those arguments (positional
/// ones in that order, as in its signature).
pub(crate) fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(invalid(format!(
            "tojson takes at most {} arguments, got {}",
            NAMES.len(),
            args.len()
        )));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (i, a) in args.iter().enumerate() {
        given[i] = Some(a.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if given[i].is_some() {
                return Err(invalid(format!("tojson got {name} twice")));
            }
            given[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let present = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_none() && !v.is_undefined()).cloned();
    let ensure_ascii = present(&given[0]).is_some_and(|v| v.is_true());
    let indent = match present(&given[1]) {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
        Some(v) if v.kind() == ValueKind::Number => {
            // json.dumps: an int indent is that many spaces (<= 0: newlines only).
            let n = v
                .as_i64()
                .ok_or_else(|| invalid(format!("tojson: indent must be an integer or a string, got {v}")))?;
            Some(" ".repeat(n.clamp(0, 64) as usize))
        }
        Some(v) => {
            return Err(invalid(format!(
                "tojson: indent must be an integer or a string, got {v}"
            )));
        }
    };
    let (item_sep, key_sep) = match present(&given[2]) {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some(v) => {
            let parts: Vec<Value> = v
                .try_iter()
                .map_err(|_| invalid(format!("tojson: separators must be a pair of strings, got {v}")))?
                .collect();
            match &parts[..] {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(invalid(format!(
                        "tojson: separators must be a pair of strings, got {v}"
                    )));
                }
            }
        }
    };
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys: present(&given[3]).is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    write_json(&value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

fn write_json(v: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(v, out),
        ValueKind::String => write_str(v.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, style, depth, '[', ']', items.len(), |i, out| {
                write_json(&items[i], style, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                let name = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    // json.dumps turns these keys into strings.
                    ValueKind::Number | ValueKind::Bool | ValueKind::None => {
                        let mut s = String::new();
                        write_json(&key, style, depth, &mut s)?;
                        s
                    }
                    other => return Err(invalid(format!("tojson: keys must be strings, not {other}"))),
                };
                entries.push((name, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, style, depth, '{', '}', entries.len(), |i, out| {
                write_str(&entries[i].0, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                write_json(&entries[i].1, style, depth + 1, out)
            })?;
        }
        other => {
            return Err(invalid(format!(
                "tojson: a value of type {other} is not JSON serializable"
            )));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    n: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if n == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    for i in 0..n {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        item(i, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python's `repr` of a number: integers as they are, floats with the
/// shortest round-trip digits, in exponent form below 1e-4 and from 1e16.
fn write_number(v: &Value, out: &mut String) {
    if v.is_integer() {
        out.push_str(&v.to_string());
        return;
    }
    let x = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&python_float(x));
    }
}

fn python_float(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, like repr.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') { s } else { format!("{s}.0") }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// A JSON string as `json.dumps` writes it: `"` `\` and control characters
/// escaped (`\n` `\r` `\t` `\b` `\f`, else `\u00XX`), and with
/// `ensure_ascii` every non-ASCII character as `\uXXXX` (UTF-16 pairs).
fn write_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_and_strftime() {
        // 2025-08-05 17:04:09 UTC, a Tuesday, day 217.
        let t = 1_754_413_449;
        assert_eq!(strftime(t, "%Y-%m-%d").unwrap(), "2025-08-05");
        assert_eq!(
            strftime(
                t,
                "%d %b %Y, %A %B %e %j %H:%M:%S %I%p %a %u %w %y %C %F %D %T %R %Z %z %%"
            )
            .unwrap(),
            "05 Aug 2025, Tuesday August  5 217 17:04:09 05PM Tue 2 2 25 20 2025-08-05 08/05/25 17:04:09 17:04 UTC +0000 %"
        );
        assert_eq!(strftime(0, "%F %T %A").unwrap(), "1970-01-01 00:00:00 Thursday");
        // Leap day and the day after, and a year end.
        assert_eq!(strftime(951_782_400, "%F %j").unwrap(), "2000-02-29 060");
        assert_eq!(strftime(951_868_800, "%F %j").unwrap(), "2000-03-01 061");
        assert_eq!(
            strftime(1_735_689_599, "%F %T %j").unwrap(),
            "2024-12-31 23:59:59 366"
        );
        assert_eq!(strftime(-1, "%F %T").unwrap(), "1969-12-31 23:59:59");
        assert!(strftime(t, "%Q").unwrap_err().to_string().contains("%Q"));
        assert!(strftime(t, "50%").is_err());
    }

    #[test]
    fn python_floats() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1.5e300, "1.5e+300"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(python_float(x), want, "{x}");
        }
    }
}
