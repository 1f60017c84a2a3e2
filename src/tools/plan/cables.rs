//! The cables file: which port of which server is cabled to which port of which other server.
//!
//! The format is the one of the B300 mesh address generator admins already use:
//!
//! ```text
//! # cables.txt — `SERVER-PORT > SERVER-PORT`, servers 1..N, ports as the model numbers them
//! 1-1 > 2-1
//! 1-2 > 2-2, 1-3 > 3-3     # several cables on one line, separated by commas
//! ```
//!
//! `#` starts a comment, blank lines are ignored, whitespace around numbers, `-`, `>` and `,` is free. The
//! direction of `>` carries no meaning: each cable is stored with its lower-numbered server first.
//!
//! Servers may be named by host name instead of number (`b300-001-1 > b300-002-1`: the port follows the
//! last `-`). `server N = NAME` lines pin a name to a number; without them, names are numbered 1.. in
//! natural order (`gpu2` before `gpu10`). Numbers and undeclared names do not mix. A `model = NAME`
//! line names the server model (as `--model` does).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::{PortMap, collected};
use crate::error::Result;

/// One end of a cable: a server (1-based) and a port of its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    pub server: u32,
    pub port: u32,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.server, self.port)
    }
}

/// A validated cable: `a.server < b.server`; `line` is where the file names it (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cable {
    pub line: usize,
    pub a: Endpoint,
    pub b: Endpoint,
}

/// A validated cables file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cables {
    /// Servers 1..=servers (given with `--servers`, else the highest server the file names).
    pub servers: u32,
    /// In file order.
    pub cables: Vec<Cable>,
    /// Host names of servers (`server N = NAME` lines, or names used in place of numbers).
    pub names: BTreeMap<u32, String>,
}

/// Parses and validates a cables file against a port map, collecting every error before failing.
///
/// `source` names the file in messages (`FILE:LINE: what`). `servers` is `--servers N` when given; otherwise
/// the highest server number in the file. Errors: bad syntax, a server or port of 0 or out of range, a port the
/// map lacks, a cable from a server to itself, a port used twice, a cable given twice, no cable at all.
pub fn parse(source: &str, text: &str, map: &PortMap, servers: Option<u32>) -> Result<Cables> {
    // (line, message); sorted by line before reporting, so syntax and semantic errors interleave in file order.
    let mut errors: Vec<(usize, String)> = Vec::new();
    let mut named: Vec<(usize, RawEnd, RawEnd)> = Vec::new();
    // The text of each cable as the file writes it, for messages (`spark-b-2 > spark-c-1`).
    let mut written: Vec<String> = Vec::new();
    let mut decls: BTreeMap<u32, (String, usize)> = BTreeMap::new();
    // A byte-order mark (some Windows editors write one) is not part of the first line.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (idx, line_text) in text.lines().enumerate() {
        let line = idx + 1;
        let content = line_text.split('#').next().unwrap_or("");
        for item in content.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if model_line(item).is_some() {
                continue; // read by `declared_model`
            }
            if let Some(decl) = declaration(item) {
                match decl {
                    Ok((n, name)) => {
                        if let Some((other, at)) = decls.get(&n) {
                            errors.push((line, format!(
                                "{source}:{line}: server {n} is already named {other} at line {at}; give each server one name"
                            )));
                        } else if let Some((m, (_, at))) =
                            decls.iter().find(|(_, (v, _))| *v == name)
                        {
                            errors.push((line, format!(
                                "{source}:{line}: {name} already names server {m} at line {at}; give each host one number"
                            )));
                        } else {
                            decls.insert(n, (name, line));
                        }
                    }
                    Err(why) => errors.push((line, format!("{source}:{line}: {why}"))),
                }
                continue;
            }
            match parse_item(item) {
                Ok((x, y)) => {
                    named.push((line, x, y));
                    written.push(item.to_string());
                }
                Err(why) => errors.push((line, format!("{source}:{line}: {why}"))),
            }
        }
    }
    let names = resolve_names(source, &named, &decls, &mut errors);
    let number = |e: &RawEnd| match &e.host {
        Host::Num(n) => Some(*n),
        Host::Name(h) => names.iter().find(|(_, v)| *v == h).map(|(k, _)| *k),
    };
    let mut raw: Vec<(Cable, &str)> = Vec::new();
    for ((line, x, y), text) in named.iter().zip(&written) {
        if let (Some(a), Some(b)) = (number(x), number(y)) {
            raw.push((
                Cable {
                    line: *line,
                    a: Endpoint {
                        server: a,
                        port: x.port,
                    },
                    b: Endpoint {
                        server: b,
                        port: y.port,
                    },
                },
                text.as_str(),
            ));
        }
    }
    let max_seen = raw
        .iter()
        .map(|(c, _)| c.a.server.max(c.b.server))
        .max()
        .unwrap_or(0);
    let n = servers.unwrap_or(max_seen);
    let mut used: BTreeMap<Endpoint, usize> = BTreeMap::new();
    let mut pairs: BTreeMap<(Endpoint, Endpoint), usize> = BTreeMap::new();
    let mut cables = Vec::new();
    // Servers beyond --servers are the option's fault, not the file's: reported apart.
    let mut beyond: Vec<(usize, String)> = Vec::new();
    for (c, written) in raw {
        let line = c.line;
        let (a, b) = if c.a.server <= c.b.server {
            (c.a, c.b)
        } else {
            (c.b, c.a)
        };
        let text = format!("`{written}`");
        let mut ok = true;
        if a.server == b.server {
            errors.push((line, format!(
                "{source}:{line}: {text} joins server {} to itself; a cable must join two different servers",
                a.server
            )));
            ok = false;
        }
        for e in [c.a, c.b] {
            if let Some(limit) = servers
                && e.server > limit
            {
                beyond.push((
                    line,
                    format!(
                        "{source}:{line}: {text} names server {}{}",
                        e.server,
                        names
                            .get(&e.server)
                            .map_or(String::new(), |n| format!(" ({n})"))
                    ),
                ));
                ok = false;
            }
            if map.port_of(e.server, e.port).is_none() {
                errors.push((line, format!(
                    "{source}:{line}: port {} (server {}) in {text} is not in the {} (ports {})",
                    e.port,
                    e.server,
                    map.origin,
                    map.port_list()
                )));
                ok = false;
            }
        }
        if let Some(first) = pairs.get(&(a, b)) {
            errors.push((
                line,
                format!("{source}:{line}: {text} repeats the cable at line {first}"),
            ));
            continue;
        }
        pairs.insert((a, b), line);
        for e in [c.a, c.b] {
            if let Some(first) = used.get(&e) {
                // A self-loop on one port (`1-1 > 1-1`) is already reported above.
                if !(c.a == c.b && *first == line) {
                    errors.push((line, format!(
                        "{source}:{line}: port {} of server {} is used twice: the cable at line {first} already uses it",
                        e.port, e.server
                    )));
                }
                ok = false;
            } else {
                used.insert(e, line);
            }
        }
        if ok {
            cables.push(Cable { line, a, b });
        }
    }
    if errors.is_empty()
        && let Some(limit) = servers
        && !beyond.is_empty()
    {
        return Err(crate::error::Error::InvalidUsage(format!(
            "--servers {limit} allows servers 1..={limit}, but the cables file names server {max_seen}:\n  {}\n\
             give --servers {max_seen} or more, or leave --servers out (the highest server the file names)",
            beyond
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        )));
    }
    if !beyond.is_empty() {
        errors.extend(
            beyond
                .into_iter()
                .map(|(l, m)| (l, format!("{m}, beyond --servers"))),
        );
    }
    if errors.is_empty() && cables.is_empty() {
        errors.push((
            0,
            format!("{source}: names no cable; expected lines like `1-1 > 2-1`"),
        ));
    }
    if errors.is_empty() && n < 2 {
        errors.push((
            0,
            format!("{source}: --servers {n}: a mesh needs at least 2 servers"),
        ));
    }
    if !errors.is_empty() {
        errors.sort_by_key(|(line, _)| *line);
        let errors = errors.into_iter().map(|(_, m)| m).collect();
        return Err(collected(source, "cables file", errors));
    }
    Ok(Cables {
        servers: n,
        cables,
        names,
    })
}

/// A server as a cables line names it: its number, or a host name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Num(u32),
    Name(String),
}

/// One end as written: a server (number or name) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawEnd {
    host: Host,
    port: u32,
}

/// `model = NAME` (a built-in model or a map file): the name, when `item` is such a line.
fn model_line(item: &str) -> Option<&str> {
    let (head, name) = item.split_once('=')?;
    head.trim()
        .eq_ignore_ascii_case("model")
        .then(|| name.trim())
}

/// The model a cables file names in a `model = NAME` line, with its line number.
pub fn declared_model(text: &str) -> Option<(usize, String)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines().enumerate().find_map(|(i, l)| {
        let content = l.split('#').next().unwrap_or("");
        content
            .split(',')
            .find_map(|item| model_line(item.trim()))
            .map(|m| (i + 1, m.to_string()))
    })
}

/// What a cables file says about the hardware before any model is known: the highest port it uses
/// and the host names it gives (well-formed cables and declarations only; `parse` reports the rest).
pub fn hardware_hints(text: &str) -> (u32, Vec<String>) {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut max_port = 0;
    let mut names = Vec::new();
    for l in text.lines() {
        let content = l.split('#').next().unwrap_or("");
        for item in content.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if let Some(Ok((_, name))) = declaration(item) {
                names.push(name);
            } else if let Ok((a, b)) = parse_item(item) {
                for e in [a, b] {
                    max_port = max_port.max(e.port);
                    if let Host::Name(n) = e.host {
                        names.push(n);
                    }
                }
            }
        }
    }
    (max_port, names)
}

/// `server N = NAME`: `None` when `item` is not a declaration, else the number and name (or why not).
fn declaration(item: &str) -> Option<std::result::Result<(u32, String), String>> {
    let (head, name) = item.split_once('=')?;
    let head = head.trim();
    let num = head
        .get(..6)
        .filter(|k| k.eq_ignore_ascii_case("server"))
        .map(|_| head[6..].trim())?;
    let name = name.trim();
    Some(match num.parse::<u32>() {
        Ok(0) | Err(_) => Err(format!(
            "`{item}`: expected `server N = HOSTNAME` with N a whole number from 1"
        )),
        Ok(n) => check_name(name)
            .map(|()| (n, name.to_string()))
            .map_err(|why| format!("`{item}`: {why}")),
    })
}

/// A host name as a cables file may use it: letters, digits, `-`, `.`, `_`, at least one letter.
fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok_chars = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && name.bytes().any(|b| b.is_ascii_alphabetic());
    if ok_chars {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a host name (letters, digits, '-', '.', '_', at least one letter, at most 63)"
        ))
    }
}

/// Natural order: digit runs compare as numbers (`gpu2` < `gpu10`).
fn natural_key(s: &str) -> Vec<(u8, u64, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            out.push((0, rest[..digits].parse().unwrap_or(u64::MAX), String::new()));
            rest = &rest[digits..];
        } else {
            let other = rest.bytes().take_while(|b| !b.is_ascii_digit()).count();
            out.push((1, 0, rest[..other].to_string()));
            rest = &rest[other..];
        }
    }
    out
}

/// The names of the servers: the declared ones, or the names used numbered in natural order when
/// nothing is declared. Adds an error for a name that is not declared while others are, and for
/// undeclared names mixed with numbers.
fn resolve_names(
    source: &str,
    named: &[(usize, RawEnd, RawEnd)],
    decls: &BTreeMap<u32, (String, usize)>,
    errors: &mut Vec<(usize, String)>,
) -> BTreeMap<u32, String> {
    let mut used: Vec<(String, usize)> = Vec::new();
    let mut first_number: Option<usize> = None;
    for (line, x, y) in named {
        for e in [x, y] {
            match &e.host {
                Host::Name(n) if !used.iter().any(|(u, _)| u == n) => used.push((n.clone(), *line)),
                Host::Num(_) if first_number.is_none() => first_number = Some(*line),
                _ => {}
            }
        }
    }
    if !decls.is_empty() {
        for (n, line) in &used {
            if !decls.values().any(|(d, _)| d == n) {
                errors.push((*line, format!(
                    "{source}:{line}: {n} is not a declared server; add `server N = {n}` (declared: {})",
                    decls.iter().map(|(k, (v, _))| format!("{k} = {v}")).collect::<Vec<_>>().join(", ")
                )));
            }
        }
        return decls.iter().map(|(k, (v, _))| (*k, v.clone())).collect();
    }
    if used.is_empty() {
        return BTreeMap::new();
    }
    if let Some(line) = first_number {
        errors.push((line, format!(
            "{source}:{line}: the file names servers by number here and by host name elsewhere ({}, line {}); \
             declare the names (`server N = {}`) to mix them",
            used[0].0, used[0].1, used[0].0
        )));
        return BTreeMap::new();
    }
    let mut sorted: Vec<String> = used.into_iter().map(|(n, _)| n).collect();
    sorted.sort_by_key(|n| natural_key(n));
    (1u32..).zip(sorted).collect()
}

/// `S-P > S-P` → the two ends, as written.
fn parse_item(item: &str) -> std::result::Result<(RawEnd, RawEnd), String> {
    const EXPECTED: &str = "expected `SERVER-PORT > SERVER-PORT`, e.g. `1-1 > 2-1`";
    // The usual slips get a message that names them instead of a complaint about a side.
    if item.contains(';') {
        return Err(format!(
            "`{item}` contains `;`; separate cables with `,` (e.g. `1-1 > 2-1, 1-2 > 2-2`) or put each on its own line"
        ));
    }
    if item.contains("->") || item.contains("=>") || item.contains('<') {
        return Err(format!(
            "`{item}` joins the ends with something other than `>`; write a single `>` (`1-1 > 2-1`); the direction carries no meaning"
        ));
    }
    let sides: Vec<&str> = item.split('>').collect();
    if sides.len() != 2 {
        let what = if sides.len() < 2 {
            "has no `>`"
        } else {
            "has more than one `>` (two cables on one line need a `,` between them)"
        };
        return Err(format!("`{item}` {what}; {EXPECTED}"));
    }
    let (left, right) = (sides[0].trim(), sides[1].trim());
    if left.is_empty() || right.is_empty() {
        let which = if left.is_empty() {
            "nothing before `>`"
        } else {
            "nothing after `>`"
        };
        return Err(format!("`{item}` has {which}; {EXPECTED}"));
    }
    let a = parse_side(left, item)?;
    let b = parse_side(right, item)?;
    Ok((a, b))
}

/// `SERVER-PORT`, where SERVER is a number or a host name (the port follows the last `-`).
fn parse_side(side: &str, item: &str) -> std::result::Result<RawEnd, String> {
    let Some((s, p)) = side.rsplit_once('-') else {
        return Err(format!(
            "`{side}` in `{item}` is not `SERVER-PORT`; expected a server number or host name and a port joined by `-`, e.g. `2-1` or `b300-002-1`"
        ));
    };
    let (s, p) = (s.trim(), p.trim());
    let port = match p.parse::<u32>() {
        Ok(0) => return Err(format!("port 0 in `{item}`: ports are numbered from 1")),
        Ok(v) => v,
        Err(_) => {
            return Err(format!(
                "`{p}` in `{item}` is not a port number; expected a whole number from 1"
            ));
        }
    };
    let host = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        match s.parse::<u32>() {
            Ok(0) => return Err(format!("server 0 in `{item}`: servers are numbered from 1")),
            Ok(v) => Host::Num(v),
            Err(_) => {
                return Err(format!(
                    "`{s}` in `{item}` is not a server number; expected a whole number from 1"
                ));
            }
        }
    } else if check_name(s).is_ok() {
        Host::Name(s.to_string())
    } else {
        return Err(format!(
            "`{s}` in `{item}` is not a server number or host name; expected e.g. `2` or `b300-002`"
        ));
    };
    Ok(RawEnd { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b300() -> PortMap {
        PortMap::b300()
    }

    #[test]
    fn parses_seed_002_form() {
        let c = parse(
            "c.txt",
            "# cables.txt\n\n1-1 > 2-1\n  2-2>1-2  # reversed\n",
            &b300(),
            None,
        )
        .unwrap();
        assert_eq!(c.servers, 2);
        assert_eq!(c.cables.len(), 2);
        assert_eq!(c.cables[1].line, 4);
        assert_eq!(c.cables[1].a, Endpoint { server: 1, port: 2 });
        assert_eq!(c.cables[1].b, Endpoint { server: 2, port: 2 });
    }

    #[test]
    fn several_per_line_and_whitespace() {
        let c = parse(
            "c.txt",
            "1 - 1 > 2 - 1 ,  1-2 > 3-2,\n2-3>3-3",
            &b300(),
            Some(4),
        )
        .unwrap();
        assert_eq!(c.servers, 4);
        assert_eq!(c.cables.len(), 3);
        assert_eq!(c.cables[1].line, 1);
        assert_eq!(c.cables[2].line, 2);
    }

    #[test]
    fn collects_every_error() {
        let text = "1-1 2-1\n1-x > 2-1\n1-1 > 1-2\n1-9 > 2-9\n1-3 > 2-3\n2-3 > 1-3\n1-3 > 3-4\n0-1 > 2-1\n1-4 > 5-4\n";
        let e = parse("c.txt", text, &b300(), Some(4))
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.txt:1: `1-1 2-1` has no `>`"), "{e}");
        assert!(
            e.contains("c.txt:2: `x` in `1-x > 2-1` is not a port number"),
            "{e}"
        );
        assert!(
            e.contains("c.txt:3: `1-1 > 1-2` joins server 1 to itself"),
            "{e}"
        );
        assert!(e.contains("c.txt:4: port 9 (server 1) in `1-9 > 2-9` is not in the built-in map b300 (ports 1-8)"), "{e}");
        assert!(
            e.contains("c.txt:6: `2-3 > 1-3` repeats the cable at line 5"),
            "{e}"
        );
        assert!(
            e.contains(
                "c.txt:7: port 3 of server 1 is used twice: the cable at line 5 already uses it"
            ),
            "{e}"
        );
        assert!(
            e.contains("c.txt:8: server 0 in `0-1 > 2-1`: servers are numbered from 1"),
            "{e}"
        );
        assert!(
            e.contains("c.txt:9: `1-4 > 5-4` names server 5, beyond --servers"),
            "{e}"
        );
    }

    #[test]
    fn usual_slips_say_what_was_expected() {
        let err = |text: &str| parse("c.txt", text, &b300(), None).unwrap_err().to_string();
        let e = err("1-1 -> 2-1\n");
        assert!(e.contains("write a single `>`"), "{e}");
        let e = err("1-1 > 2-1; 1-2 > 2-2\n");
        assert!(e.contains("separate cables with `,`"), "{e}");
        let e = err("1-1 >\n");
        assert!(e.contains("`1-1 >` has nothing after `>`"), "{e}");
        let e = err("> 2-1\n");
        assert!(e.contains("has nothing before `>`"), "{e}");
        let e = err("1-1 > 2-1 > 3-1\n");
        assert!(e.contains("need a `,` between them"), "{e}");
    }

    #[test]
    fn host_names_instead_of_numbers() {
        // Undeclared names are numbered in natural order, whatever the line order.
        let c = parse(
            "c.txt",
            "gpu10-1 > gpu2-1\ngpu2-2 > gpu3-2\n",
            &b300(),
            None,
        )
        .unwrap();
        assert_eq!(c.servers, 3);
        let names: Vec<&str> = c.names.values().map(String::as_str).collect();
        assert_eq!(names, ["gpu2", "gpu3", "gpu10"]);
        assert_eq!(c.cables[0].a, Endpoint { server: 1, port: 1 });
        assert_eq!(c.cables[0].b, Endpoint { server: 3, port: 1 });
        // Declarations pin the numbers, and let names and numbers mix.
        let c = parse(
            "c.txt",
            "server 2 = b300-001\nserver 1 = b300-002\nb300-001-1 > 1-1\n",
            &b300(),
            None,
        )
        .unwrap();
        assert_eq!(c.cables[0].a, Endpoint { server: 1, port: 1 });
        assert_eq!(c.cables[0].b, Endpoint { server: 2, port: 1 });
        assert_eq!(c.names[&2], "b300-001");
        let err = |text: &str| parse("c.txt", text, &b300(), None).unwrap_err().to_string();
        let e = err("a-1 > 2-1\n");
        assert!(e.contains("declare the names (`server N = a`)"), "{e}");
        let e = err("server 1 = a\nserver 2 = b\na-1 > c-1\n");
        assert!(
            e.contains("c.txt:3: c is not a declared server; add `server N = c`"),
            "{e}"
        );
        let e = err("server 1 = a\nserver 1 = b\n");
        assert!(e.contains("server 1 is already named a at line 1"), "{e}");
        let e = err("server x = a\n1-1 > 2-1\n");
        assert!(e.contains("expected `server N = HOSTNAME`"), "{e}");
    }

    #[test]
    fn crlf_and_byte_order_mark() {
        let c = parse("c.txt", "\u{feff}1-1 > 2-1\r\n1-2 > 2-2\r\n", &b300(), None).unwrap();
        assert_eq!(c.cables.len(), 2);
    }

    #[test]
    fn empty_file_is_an_error() {
        let e = parse("c.txt", "# none\n", &b300(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.txt: names no cable"), "{e}");
    }
}
