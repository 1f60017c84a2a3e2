//! `NCCL_IB_HCA`: which RDMA devices and ports the plugin may use, with NCCL 2.30's grammar
//! (NCCL `src/misc/utils.cc parseStringList/matchIfList`,
//! `src/transport/net_ib/init.cc ncclIbInitDevices`).
//!
//! ```text
//! [^][=]<hca>[:<port>[:<rail>[:<plane>]]][,<hca>[:<port>[:<rail>[:<plane>]]]]…
//! ```
//!
//! * `^` (first character) turns the list into an exclude list; `=` (first, or right after `^`)
//!   makes names match exactly. Both apply to the whole list, never to one entry.
//! * Without `=`, an entry matches every device whose name *starts with* it: `mlx5_1` matches
//!   `mlx5_1` and `mlx5_10` … `mlx5_19`, as in NCCL.
//! * An absent or empty port matches every port; rail and plane are copied to the v12 properties
//!   of the devices an include entry selects (`mlx5_0::0:0`: all ports, rail 0, plane 0).
//!
//! Where NCCL silently accepts nonsense, this parser refuses it: an entry with a port but no name,
//! a `^`/`=` inside the list (`^=a,^=b`), port 0 or > 255, a number that is not decimal or
//! overflows, a plane that collides with NCCL's virtual-plane bit, more than 32 entries, and a
//! list that is empty after its prefix (`^` alone would exclude nothing in intent but everything in
//! NCCL). Empty entries (`a,,b`, a trailing comma) are skipped as NCCL does; whitespace around
//! entries and fields is ignored.
#![forbid(unsafe_code)]

use super::values::{Reject, parse_decimal_u64};

/// NCCL's `MAX_IB_DEVS`: at most this many entries are read.
pub const MAX_HCA_ENTRIES: usize = 32;
/// The longest device name the kernel allows (`IB_DEVICE_NAME_MAX` − 1).
pub const MAX_HCA_NAME_LEN: usize = 63;
/// Largest rail id (`int16_t railId` in the v12 properties).
pub const MAX_RAIL: i16 = i16::MAX;
/// Largest plane id: NCCL reserves bit 14 (`NCCL_IB_PLANE_VIRT_BIT`) for merged devices.
pub const MAX_PLANE: i16 = (1 << 14) - 1;

/// The accepted forms, quoted in every error.
pub const HCA_GRAMMAR: &str = "a comma-separated list [^][=]<hca>[:<port>[:<rail>[:<plane>]]],… where ^ (first) \
excludes, = (first, or after ^) matches names exactly instead of by prefix, <port> is 1..=255 or empty for all \
ports, <rail> is 0..=32767 and <plane> 0..=16383 (e.g. mlx5_0:1,mlx5_1 or ^=mlx5_2)";

/// One entry of `NCCL_IB_HCA`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name, or name prefix when the filter is not exact.
    pub name: String,
    /// IB port number (1-based); `None` matches every port.
    pub port: Option<u8>,
    /// Rail id for the v12 properties; `None` is `NCCL_NET_ID_UNDEF` (-1).
    pub rail: Option<i16>,
    /// Plane id for the v12 properties; `None` is `NCCL_NET_ID_UNDEF` (-1).
    pub plane: Option<i16>,
}

impl HcaEntry {
    fn matches(&self, dev_name: &str, port: u8, exact: bool) -> bool {
        let name_ok = if exact {
            dev_name == self.name
        } else {
            dev_name.starts_with(self.name.as_str())
        };
        name_ok && self.port.is_none_or(|p| p == port)
    }
}

/// A parsed `NCCL_IB_HCA`. The default (variable unset or empty) selects every device and port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// A filter that selects everything (`NCCL_IB_HCA` unset).
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses a value of `NCCL_IB_HCA`. An empty or all-blank value selects everything, as NCCL does.
    /// Errors are [`crate::error::Error::InvalidUsage`] naming the variable, the value and [`HCA_GRAMMAR`].
    pub fn parse(value: &str) -> crate::error::Result<Self> {
        Self::parse_inner(value).map_err(|why| {
            crate::error::Error::InvalidUsage(format!(
                "NCCL_IB_HCA={value:?} is invalid: {why}; accepted: {HCA_GRAMMAR}"
            ))
        })
    }

    pub(crate) fn parse_inner(value: &str) -> Result<Self, Reject> {
        let mut rest = value.trim();
        if rest.is_empty() {
            return Ok(Self::all());
        }
        let exclude = rest.starts_with('^');
        if exclude {
            rest = rest[1..].trim_start();
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = rest[1..].trim_start();
        }
        let mut entries = Vec::new();
        for (i, raw) in rest.split(',').enumerate() {
            let raw = raw.trim();
            if raw.is_empty() {
                continue; // NCCL (strtok_r) skips empty entries
            }
            let entry =
                parse_entry(raw).map_err(|why| format!("entry {} {raw:?}: {why}", i + 1))?;
            if exclude && (entry.rail.is_some() || entry.plane.is_some()) {
                return Err(format!(
                    "entry {} {raw:?}: a rail or plane in an exclude (^) list has no effect; \
                     give rails and planes in an include list",
                    i + 1
                ));
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            return Err("the list names no device after its ^/= prefix".into());
        }
        if entries.len() > MAX_HCA_ENTRIES {
            return Err(format!(
                "{} entries, but at most {MAX_HCA_ENTRIES} are read (NCCL's MAX_IB_DEVS)",
                entries.len()
            ));
        }
        Ok(Self {
            exclude,
            exact,
            entries,
        })
    }

    /// `true` if the user gave no list (every device and port is selected).
    pub fn is_all(&self) -> bool {
        self.entries.is_empty()
    }

    /// `true` for a `^` list.
    pub fn is_exclude(&self) -> bool {
        self.exclude
    }

    /// `true` for a `=` list (exact names instead of prefixes).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// The entries in the order given.
    pub fn entries(&self) -> &[HcaEntry] {
        &self.entries
    }

    /// Whether the device `dev_name`, port `port` (1-based) may be used.
    pub fn matches(&self, dev_name: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        self.find(dev_name, port).is_some() != self.exclude
    }

    /// The first include entry that selects this device and port (NCCL uses the first match), or
    /// `None` for an exclude list, an empty list, or no match.
    pub fn selecting_entry(&self, dev_name: &str, port: u8) -> Option<&HcaEntry> {
        if self.exclude {
            return None;
        }
        self.find(dev_name, port)
    }

    /// The (rail, plane) the user assigned to this device and port; `(None, None)` means
    /// `NCCL_NET_ID_UNDEF` for both.
    pub fn rail_plane(&self, dev_name: &str, port: u8) -> (Option<i16>, Option<i16>) {
        self.selecting_entry(dev_name, port)
            .map_or((None, None), |e| (e.rail, e.plane))
    }

    fn find(&self, dev_name: &str, port: u8) -> Option<&HcaEntry> {
        self.entries
            .iter()
            .find(|e| e.matches(dev_name, port, self.exact))
    }
}

impl std::fmt::Display for HcaFilter {
    /// Writes the canonical form (which parses back to an equal filter); `<all>` when unset.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("<all>");
        }
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            let fields = [
                e.port.map(i64::from),
                e.rail.map(i64::from),
                e.plane.map(i64::from),
            ];
            let last = fields.iter().rposition(Option::is_some);
            if let Some(last) = last {
                for v in &fields[..=last] {
                    f.write_str(":")?;
                    if let Some(v) = v {
                        write!(f, "{v}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn parse_entry(raw: &str) -> Result<HcaEntry, Reject> {
    let mut fields = raw.split(':').map(str::trim);
    let name = fields.next().unwrap_or("");
    if name.is_empty() {
        return Err("the device name is missing".into());
    }
    if name.starts_with('^') || name.starts_with('=') || name.contains(['^', '=']) {
        return Err(
            "^ and = apply to the whole list and must come first, ^ before = (write ^=a,b, not ^=a,^=b or =^a)"
                .into(),
        );
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '/')
    {
        return Err(format!("the device name contains {c:?}"));
    }
    if name.len() > MAX_HCA_NAME_LEN {
        return Err(format!(
            "the device name is {} bytes long; device names have at most {MAX_HCA_NAME_LEN}",
            name.len()
        ));
    }
    let port = match fields.next() {
        None | Some("") => None,
        Some(p) => {
            let v = parse_decimal_u64(p).map_err(|why| format!("port {p:?}: {why}"))?;
            match u8::try_from(v) {
                Ok(v) if v >= 1 => Some(v),
                _ => return Err(format!("port {p:?} is out of range 1..=255")),
            }
        }
    };
    let rail = parse_id(fields.next(), "rail", MAX_RAIL)?;
    let plane = parse_id(fields.next(), "plane", MAX_PLANE)?;
    if let Some(extra) = fields.next() {
        return Err(format!(
            "unexpected fifth field {extra:?}; an entry has at most <hca>:<port>:<rail>:<plane>"
        ));
    }
    Ok(HcaEntry {
        name: name.to_string(),
        port,
        rail,
        plane,
    })
}

fn parse_id(field: Option<&str>, what: &str, max: i16) -> Result<Option<i16>, Reject> {
    match field {
        None | Some("") => Ok(None),
        Some(s) => {
            let v = parse_decimal_u64(s).map_err(|why| format!("{what} {s:?}: {why}"))?;
            match i16::try_from(v) {
                Ok(v) if v <= max => Ok(Some(v)),
                _ => Err(format!("{what} {s:?} is out of range 0..={max}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> HcaFilter {
        HcaFilter::parse(s).unwrap()
    }

    fn err(s: &str) -> String {
        HcaFilter::parse(s).unwrap_err().to_string()
    }

    #[test]
    fn unset_and_blank_select_everything() {
        for s in ["", "   "] {
            let f = p(s);
            assert!(f.is_all());
            assert!(f.matches("mlx5_0", 1));
            assert!(f.matches("anything", 200));
            assert_eq!(f.rail_plane("mlx5_0", 1), (None, None));
        }
    }

    #[test]
    fn prefix_matches_longer_names_like_nccl() {
        let f = p("mlx5_1");
        assert!(f.matches("mlx5_1", 1));
        assert!(f.matches("mlx5_11", 1));
        assert!(f.matches("mlx5_19", 2));
        assert!(!f.matches("mlx5_0", 1));
        assert!(!f.matches("mlx5_", 1));
    }

    #[test]
    fn exact_does_not_match_longer_names() {
        let f = p("=mlx5_1");
        assert!(f.is_exact());
        assert!(f.matches("mlx5_1", 1));
        assert!(!f.matches("mlx5_11", 1));
        assert!(!f.matches("mlx5_", 1));
    }

    #[test]
    fn exclude_exact_list() {
        let f = p("^=a,b");
        assert!(f.is_exclude() && f.is_exact());
        assert_eq!(f.entries().len(), 2);
        assert!(!f.matches("a", 1));
        assert!(!f.matches("b", 7));
        assert!(f.matches("ab", 1));
        assert!(f.matches("c", 1));
        assert_eq!(f.selecting_entry("c", 1), None);
    }

    #[test]
    fn exclude_prefix_list() {
        let f = p("^mlx5_1");
        assert!(!f.matches("mlx5_1", 1));
        assert!(!f.matches("mlx5_12", 1));
        assert!(f.matches("mlx5_0", 1));
    }

    #[test]
    fn ports_select_one_port() {
        let f = p("mlx5_0:1,mlx5_1:2");
        assert!(f.matches("mlx5_0", 1));
        assert!(!f.matches("mlx5_0", 2));
        assert!(f.matches("mlx5_1", 2));
        assert!(!f.matches("mlx5_1", 1));
        let ex = p("^=mlx5_0:2");
        assert!(ex.matches("mlx5_0", 1));
        assert!(!ex.matches("mlx5_0", 2));
    }

    #[test]
    fn rail_and_plane_per_entry() {
        let f = p("rocep1s0f0:1:0:0,roceP2p1s0f0::1:2,mlx5_0::0:0,mlx5_9:1:5");
        assert_eq!(f.rail_plane("rocep1s0f0", 1), (Some(0), Some(0)));
        assert_eq!(f.rail_plane("roceP2p1s0f0", 3), (Some(1), Some(2)));
        assert_eq!(f.rail_plane("mlx5_0", 2), (Some(0), Some(0)));
        assert_eq!(f.rail_plane("mlx5_9", 1), (Some(5), None));
        assert_eq!(f.rail_plane("mlx5_9", 2), (None, None)); // not selected
        assert!(!f.matches("mlx5_9", 2));
        // First match wins, as in NCCL's matchIfList.
        let g = p("mlx5:1:3,mlx5_0:1:4");
        assert_eq!(g.rail_plane("mlx5_0", 1), (Some(3), None));
    }

    #[test]
    fn empty_entries_are_skipped() {
        let f = p("mlx5_0,,mlx5_1,");
        assert_eq!(f.entries().len(), 2);
        assert!(f.matches("mlx5_1", 1));
        assert_eq!(p(",mlx5_0").entries().len(), 1);
    }

    #[test]
    fn whitespace_around_entries_and_fields_is_ignored() {
        let f = p("  ^= mlx5_0 : 1 , mlx5_1  ");
        assert!(f.is_exclude() && f.is_exact());
        assert_eq!(
            f.entries()[0],
            HcaEntry {
                name: "mlx5_0".into(),
                port: Some(1),
                rail: None,
                plane: None
            }
        );
        assert!(err("mlx5 0").contains("contains ' '"));
    }

    #[test]
    fn refuses_nonsense_with_one_clear_error() {
        let cases: &[(&str, &str)] = &[
            ("mlx5_0:0", "out of range 1..=255"),
            ("mlx5_0:256", "out of range 1..=255"),
            ("mlx5_0:99999999999999999999", "too large"),
            ("mlx5_0:-1", "non-negative decimal"),
            ("mlx5_0:x", "non-negative decimal"),
            ("mlx5_0:0x1", "non-negative decimal"),
            (":1", "name is missing"),
            ("^", "names no device"),
            ("^=", "names no device"),
            ("=", "names no device"),
            (",", "names no device"),
            ("^=mlx5_8,^=mlx5_14", "must come first"),
            ("=^mlx5_8", "must come first"),
            ("mlx5_0,=mlx5_1", "must come first"),
            ("mlx5_0:1:2:3:4", "fifth field"),
            ("mlx5_0:1:32768", "rail"),
            ("mlx5_0:1:0:16384", "plane"),
            ("mlx5_0:1:-1", "rail"),
            ("^mlx5_0:1:0", "exclude"),
            ("a/b", "contains '/'"),
        ];
        for (value, needle) in cases {
            let e = HcaFilter::parse(value).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, crate::error::Error::InvalidUsage(_)),
                "{value}: {e:?}"
            );
            assert!(msg.contains(needle), "{value}: {msg}");
            assert!(msg.contains("NCCL_IB_HCA="), "{value}: {msg}");
            assert!(msg.contains(&format!("{value:?}")), "{value}: {msg}");
            assert!(msg.contains("accepted:"), "{value}: {msg}");
        }
    }

    #[test]
    fn too_many_entries_or_too_long_names() {
        let many: Vec<String> = (0..33).map(|i| format!("d{i}")).collect();
        assert!(err(&many.join(",")).contains("at most 32"));
        assert_eq!(p(&many[..32].join(",")).entries().len(), 32);
        assert!(err(&"x".repeat(64)).contains("at most 63"));
    }

    #[test]
    fn display_round_trips() {
        for s in ["mlx5_0", "^=a,b", "=mlx5_0:1:2:3", "m::1", "m:::4", "^x:3"] {
            let f = p(s);
            assert_eq!(f.to_string(), s);
            assert_eq!(p(&f.to_string()), f);
        }
        assert_eq!(HcaFilter::all().to_string(), "<all>");
    }

    proptest! {
        #[test]
        fn never_panics_on_any_string(s in ".*") {
            let _ = HcaFilter::parse(&s);
        }

        #[test]
        fn never_panics_on_grammar_like_strings(s in "[\\^=]{0,2}([a-z0-9_]{0,4}(:[0-9-]{0,6}){0,5},?){0,5}") {
            if let Ok(f) = HcaFilter::parse(&s) {
                let _ = f.matches("mlx5_1", 1);
                // Canonical text parses back to the same filter.
                if !f.is_all() {
                    prop_assert_eq!(HcaFilter::parse(&f.to_string()).unwrap(), f);
                }
            }
        }

        #[test]
        fn exact_names_match_only_themselves(name in "[a-z][a-z0-9_]{0,10}", other in "[a-z][a-z0-9_]{0,10}", port in 1u8..=255) {
            let f = HcaFilter::parse(&format!("={name}")).unwrap();
            prop_assert_eq!(f.matches(&other, port), other == name);
            let g = HcaFilter::parse(&name).unwrap();
            prop_assert_eq!(g.matches(&other, port), other.starts_with(&name));
            let x = HcaFilter::parse(&format!("^={name}")).unwrap();
            prop_assert_eq!(x.matches(&other, port), other != name);
        }
    }
}
