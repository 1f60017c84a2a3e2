//! Parsers for single environment values: integers with NCCL's `strtoll(…, 0)` forms, booleans,
//! byte sizes and durations, and the range-checked forms the configuration table uses. Each returns
//! why a value was rejected, so the caller can build one error naming the variable, the value and
//! the accepted forms.
#![forbid(unsafe_code)]

use std::ops::RangeInclusive;
use std::time::Duration;

/// Why a value was rejected: a sentence saying what is accepted.
pub(crate) type Reject = String;

/// Parses a signed integer the way NCCL's `NCCL_PARAM` does (`strtoll(s, NULL, 0)`): decimal or
/// `0x` hexadecimal, optional sign. Unlike `strtoll` it rejects trailing garbage, overflow and a
/// leading `0` on a multi-digit decimal (which `strtoll` would read as octal: `010` is 8 for NCCL).
pub(crate) fn parse_int(s: &str) -> Result<i64, Reject> {
    let t = s.trim();
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if body.is_empty() {
        return Err("expected an integer".into());
    }
    let magnitude: u64 = if let Some(hex) =
        body.strip_prefix("0x").or_else(|| body.strip_prefix("0X"))
    {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("expected hexadecimal digits after 0x".into());
        }
        u64::from_str_radix(hex, 16).map_err(|_| "the number is too large".to_string())?
    } else {
        if !body.bytes().all(|b| b.is_ascii_digit()) {
            return Err("expected a decimal integer (or 0x… hexadecimal)".into());
        }
        if body.len() > 1 && body.starts_with('0') {
            return Err(
                "a leading 0 is ambiguous (NCCL reads it as octal); write the decimal value without leading zeros"
                    .into(),
            );
        }
        body.parse::<u64>()
            .map_err(|_| "the number is too large".to_string())?
    };
    if neg {
        if magnitude > i64::MAX as u64 + 1 {
            return Err("the number is too large".into());
        }
        Ok((magnitude as i128).wrapping_neg() as i64)
    } else {
        i64::try_from(magnitude).map_err(|_| "the number is too large".to_string())
    }
}

/// An integer in `lo..=hi`.
pub(crate) fn parse_int_in(s: &str, lo: i64, hi: i64) -> Result<i64, Reject> {
    let v = parse_int(s)?;
    if v < lo || v > hi {
        return Err(format!("{v} is out of range"));
    }
    Ok(v)
}

/// A plain decimal field (NCCL_IB_HCA ports, rails, planes; NCCL uses `atoi`): digits only,
/// leading zeros allowed.
pub(crate) fn parse_decimal_u64(s: &str) -> Result<u64, Reject> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected a non-negative decimal number".into());
    }
    s.parse::<u64>()
        .map_err(|_| "the number is too large".to_string())
}

/// `0`/`1` (also `true`/`false`, `yes`/`no`, `on`/`off`, any case).
pub(crate) fn parse_bool(s: &str) -> Result<bool, Reject> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 0 or 1 (also accepted: true/false, yes/no, on/off)".into()),
    }
}

/// Splits `123abc` into (`123`, `abc`) after trimming.
fn split_number_suffix(s: &str) -> (&str, &str) {
    let t = s.trim();
    let end = t
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(t.len());
    (&t[..end], t[end..].trim())
}

/// A byte count: digits with an optional binary suffix `K`/`KiB` (1024), `M`/`MiB` (1024²),
/// `G`/`GiB` (1024³), or `B`; case-insensitive. Decimal `KB`/`MB` are refused as ambiguous.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, Reject> {
    let (digits, suffix) = split_number_suffix(s);
    if digits.is_empty() {
        return Err("expected a byte count such as 131072, 128K or 1M".into());
    }
    let n = parse_decimal_u64(digits)?;
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "kb" | "mb" | "gb" => {
            return Err(format!(
                "the suffix {suffix:?} is ambiguous (1000 or 1024?); use K/KiB, M/MiB or G/GiB (powers of 1024)"
            ));
        }
        _ => return Err(format!("unknown size suffix {suffix:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| "the size is too large".to_string())
}

/// A duration: a bare number is milliseconds; suffixes `ms`, `s`, `m` (minutes), `h` (hours).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, Reject> {
    parse_duration_bare(s, 1)
}

/// A duration with the suffixes of [`parse_duration`], where a bare number counts `bare_ms`
/// milliseconds: the environment's bare numbers are milliseconds (1), a command-line flag documented
/// in seconds keeps that meaning (1000).
pub(crate) fn parse_duration_bare(s: &str, bare_ms: u64) -> Result<Duration, Reject> {
    let (digits, suffix) = split_number_suffix(s);
    if digits.is_empty() {
        return Err("expected a duration such as 500ms, 30s, 2m or 1h".into());
    }
    let n = parse_decimal_u64(digits)?;
    let ms_per_unit: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => bare_ms,
        "ms" => 1,
        "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "unknown duration unit {suffix:?} (accepted: ms, s, m, h)"
            ));
        }
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| "the duration is too large".to_string())?;
    Ok(Duration::from_millis(ms))
}

/// `--flag SIZE` on the command line: the byte counts of [`parse_bytes`] (`4096`, `128K`, `1M`,
/// `16G`), as a clap value parser.
pub fn cli_bytes(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|why| {
        if why.contains("ambiguous") {
            why // it already names the accepted suffixes
        } else {
            format!("{why}; accepted: a number of bytes, or with the suffix K, M or G (powers of 1024), e.g. 1M")
        }
    })
}

/// `--flag SIZE` for a `usize` field (see [`cli_bytes`]).
pub fn cli_bytes_usize(s: &str) -> Result<usize, String> {
    let n = cli_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("{n} bytes is too large for this machine"))
}

/// `--flag DURATION` on the command line where a bare number is seconds: `60`, `10s`, `500ms`,
/// `2m`, `1h`, as a clap value parser.
pub fn cli_seconds(s: &str) -> Result<Duration, String> {
    parse_duration_bare(s, 1000).map_err(|why| {
        format!("{why}; accepted: a number of seconds, or a number with the unit ms, s, m or h, e.g. 10s")
    })
}

/// `--comm-id ID` on the command line: a communicator id, a `u64` in decimal (`12345`) or `0x`
/// hexadecimal (`0x5357beef`), not 0 (NCCL's commHash is never 0 in practice, and 0 would read as
/// "no id"), as a clap value parser.
pub fn cli_comm_id(s: &str) -> Result<u64, String> {
    const ACCEPTED: &str = "accepted: a communicator id from 1 to 18446744073709551615, decimal or 0x hexadecimal, e.g. 0x5357beef";
    let t = s.trim();
    let v = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "'{s}' has no hexadecimal digits after 0x; {ACCEPTED}"
            ));
        }
        u64::from_str_radix(hex, 16)
            .map_err(|_| format!("'{s}' is larger than 64 bits; {ACCEPTED}"))?
    } else {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("'{s}' is not a number; {ACCEPTED}"));
        }
        t.parse::<u64>()
            .map_err(|_| format!("'{s}' is larger than 64 bits; {ACCEPTED}"))?
    };
    if v == 0 {
        return Err(format!("0 is not a communicator id; {ACCEPTED}"));
    }
    Ok(v)
}

/// `-1` (automatic: `None`) or an integer in `0..=hi`.
pub(crate) fn auto_u8(s: &str, hi: u8) -> Result<Option<u8>, Reject> {
    match parse_int_in(s, -1, i64::from(hi))? {
        -1 => Ok(None),
        n => Ok(u8::try_from(n).ok()),
    }
}

/// An integer in `lo..=hi` that fits a `u8`.
pub(crate) fn u8_in(s: &str, lo: u8, hi: u8) -> Result<u8, Reject> {
    u8::try_from(parse_int_in(s, i64::from(lo), i64::from(hi))?).map_err(|_| "out of range".into())
}

/// `auto` (any case: `None`) or what `then` parses.
pub(crate) fn auto_or<T>(
    s: &str,
    then: impl Fn(&str) -> Result<T, Reject>,
) -> Result<Option<T>, Reject> {
    if s.trim().eq_ignore_ascii_case("auto") {
        Ok(None)
    } else {
        then(s).map(Some)
    }
}

/// A duration (see [`parse_duration`]) in `range`.
pub(crate) fn duration_in(s: &str, range: RangeInclusive<Duration>) -> Result<Duration, Reject> {
    let d = parse_duration(s)?;
    if !range.contains(&d) {
        return Err(format!("{} ms is out of range", d.as_millis()));
    }
    Ok(d)
}

/// A byte count (see [`parse_bytes`]) in `range`.
pub(crate) fn bytes_in(s: &str, range: RangeInclusive<u64>) -> Result<u64, Reject> {
    let n = parse_bytes(s)?;
    if !range.contains(&n) {
        return Err(format!("{n} bytes is out of range"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_ids_in_decimal_and_hex_and_never_zero() {
        assert_eq!(cli_comm_id("12345"), Ok(12345));
        assert_eq!(cli_comm_id("0x5357beef"), Ok(0x5357_beef));
        assert_eq!(cli_comm_id("0XFFFFFFFFFFFFFFFF"), Ok(u64::MAX));
        assert_eq!(cli_comm_id("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            "abc",
            "-1",
            "1.5",
            "0x",
            "0xg1",
            "12 34",
            "18446744073709551616",
            "0x1ffffffffffffffff",
            "0",
            "0x0",
        ] {
            let e = cli_comm_id(bad).expect_err(bad);
            assert!(
                e.contains("accepted: a communicator id from 1 to"),
                "{bad}: {e}"
            );
        }
        assert!(
            cli_comm_id("0")
                .unwrap_err()
                .starts_with("0 is not a communicator id")
        );
        assert!(
            cli_comm_id("abc")
                .unwrap_err()
                .contains("'abc' is not a number")
        );
    }

    #[test]
    fn ints_follow_strtoll_base0_but_strictly() {
        assert_eq!(parse_int("20"), Ok(20));
        assert_eq!(parse_int(" 20 "), Ok(20));
        assert_eq!(parse_int("0x68"), Ok(0x68));
        assert_eq!(parse_int("-1"), Ok(-1));
        assert_eq!(parse_int("+3"), Ok(3));
        assert_eq!(parse_int("0"), Ok(0));
        assert_eq!(parse_int("-9223372036854775808"), Ok(i64::MIN));
        assert!(parse_int("9223372036854775808").is_err());
        assert!(parse_int("99999999999999999999").is_err());
        assert!(parse_int("010").is_err());
        assert!(parse_int("12abc").is_err());
        assert!(parse_int("").is_err());
        assert!(parse_int("-").is_err());
        assert!(parse_int("0x").is_err());
        assert!(parse_int("1 2").is_err());
        assert!(parse_int("1.5").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("131072"), Ok(131072));
        assert_eq!(parse_bytes("128K"), Ok(128 * 1024));
        assert_eq!(parse_bytes("128 KiB"), Ok(128 * 1024));
        assert_eq!(parse_bytes("1m"), Ok(1 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert!(parse_bytes("128KB").unwrap_err().contains("ambiguous"));
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("-1K").is_err());
        assert!(parse_bytes("99999999999999999999").is_err());
        assert!(parse_bytes("17179869184G").is_err());
        assert!(parse_bytes("1T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30000"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2 min"), Ok(Duration::from_secs(120)));
        // The messages write `24h`, so `h` is accepted too.
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("24H"), Ok(Duration::from_secs(86400)));
        assert!(parse_duration("1d").unwrap_err().contains("ms, s, m, h"));
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn command_line_forms() {
        assert_eq!(cli_bytes("1M"), Ok(1 << 20));
        assert_eq!(cli_bytes("4096"), Ok(4096));
        assert_eq!(cli_bytes_usize("9k"), Ok(9216));
        assert!(cli_bytes("1MB").unwrap_err().contains("ambiguous"));
        assert_eq!(cli_seconds("60"), Ok(Duration::from_secs(60)));
        assert_eq!(cli_seconds("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(cli_seconds("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(cli_seconds("1h"), Ok(Duration::from_secs(3600)));
        assert!(cli_seconds("ten").unwrap_err().contains("e.g. 10s"));
    }

    #[test]
    fn bools() {
        assert_eq!(parse_bool("1"), Ok(true));
        assert_eq!(parse_bool(" ON "), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert_eq!(parse_bool("False"), Ok(false));
        assert!(parse_bool("2").is_err());
        assert!(parse_bool("").is_err());
    }
}
