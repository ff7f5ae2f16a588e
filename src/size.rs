//! Byte sizes as operators write them: `1073741824`, `500M`, `10Gi`, `1.5Ti`.

use std::fmt;

/// A byte count parsed from a config value or a flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// Parses a Kubernetes-style quantity: decimal (k, M, G, T, P) or binary (Ki, Mi,
/// Gi, Ti, Pi) suffixes, an optional trailing `B`, and an optional fraction.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix('B').unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "P" => 1000u64.pow(5),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => {
            return Err(format!(
                "size {s:?}: unknown unit {unit:?} (use k, M, G, T, Ki, Mi, Gi, Ti)"
            ))
        }
    };
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(format!("size {s:?} is not a number with an optional unit"));
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let int: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|e| format!("size {s:?}: {e}"))?
    };
    let mut total = int
        .checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))?;
    if !frac.is_empty() {
        let digits = frac.len().min(18) as u32;
        let f: u128 = frac[..digits as usize]
            .parse()
            .map_err(|e| format!("size {s:?}: {e}"))?;
        let part = (f * mult as u128) / 10u128.pow(digits);
        total = total
            .checked_add(part as u64)
            .ok_or_else(|| format!("size {s:?} is too large"))?;
    }
    Ok(total)
}

/// Formats a byte count with the largest binary unit that divides it exactly, or
/// with one decimal when none does (for humans only).
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (name, n) in UNITS {
        if bytes >= n {
            return if bytes.is_multiple_of(n) {
                format!("{}{name}", bytes / n)
            } else {
                format!("{:.1}{name}", bytes as f64 / n as f64)
            };
        }
    }
    format!("{bytes}")
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human(self.0))
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s).map(ByteSize)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => parse_size(&s)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quantities() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("10Mi").unwrap(), 10 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size(" 7k ").unwrap(), 7000);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "Gi", "1Xi", "-1", "1..2G", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("20000Pi").is_err());
    }

    #[test]
    fn human_units() {
        assert_eq!(human(10 << 20), "10Mi");
        assert_eq!(human(1536), "1.5Ki");
        assert_eq!(human(12), "12");
    }
}
