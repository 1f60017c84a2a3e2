//! The start pages' examples work as written: every cables file a page shows (a fenced block whose
//! first line is `# NAME.txt`) plans, and every `switchless plan NAME.txt …` line of the page runs with
//! exit status 0 on it (into a scratch directory).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

/// The fenced code blocks of a Markdown page, as their lines.
fn blocks(page: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            match cur.take() {
                Some(b) => out.push(b),
                None => cur = Some(Vec::new()),
            }
        } else if let Some(b) = cur.as_mut() {
            b.push(line.to_string());
        }
    }
    out
}

#[test]
fn start_page_plans_run_as_written() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/start");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let page = std::fs::read_to_string(&path).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for b in blocks(&page) {
            if let Some(name) = b
                .first()
                .and_then(|l| l.strip_prefix("# "))
                .and_then(|l| l.split_whitespace().next())
                .filter(|n| n.ends_with(".txt"))
            {
                std::fs::write(tmp.path().join(name), b.join("\n") + "\n").unwrap();
                files.push(name.to_string());
            }
        }
        for b in blocks(&page) {
            for line in &b {
                let cmd = line.split('#').next().unwrap_or("").trim();
                let Some(rest) = cmd.strip_prefix("switchless plan ") else {
                    continue;
                };
                let words: Vec<&str> = rest.split_whitespace().collect();
                if !files.iter().any(|f| words.first() == Some(&f.as_str())) {
                    continue;
                }
                // Redirections write into the scratch directory too.
                let (args, to): (Vec<&str>, Option<&str>) =
                    match words.iter().position(|w| *w == ">") {
                        Some(i) => (words[..i].to_vec(), words.get(i + 1).copied()),
                        None => (words, None),
                    };
                let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
                    .arg("plan")
                    .args(&args)
                    .current_dir(tmp.path())
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}: `{cmd}` failed: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                if let Some(to) = to {
                    std::fs::write(tmp.path().join(to), &out.stdout).unwrap();
                }
                ran += 1;
            }
        }
    }
    assert!(ran >= 10, "only {ran} plan commands found in docs/start");
}

#[test]
fn the_three_gb10_mesh_page_has_the_recipe() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/start/gb10-mesh3.md"),
    )
    .unwrap();
    for want in [
        "NCCL_NET=switchless",
        "NCCL_CROSS_NIC=1",
        "no NCCL_SWITCHLESS_TCP_FALLBACK",
        "srun-nccl-tests.sh -N 3 -g 1",
        "mpirun-nccl-tests.sh -H spark-a,spark-b,spark-c -g 1",
        "GB/s",
    ] {
        assert!(page.contains(want), "gb10-mesh3.md lacks {want}");
    }
}

/// The pages a user reads to run the tools explain behaviour in words, not through the code's items
/// (`HostModel::local_links`, `Plan::verify`), and cite no file the repository lacks.
#[test]
fn user_pages_speak_no_rust() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![
        root.join("README.md"),
        root.join("docs/guide/doctor.md"),
        root.join("docs/guide/plan.md"),
        root.join("docs/guide/fleet.md"),
        root.join("docs/guide/nccl-tests.md"),
        root.join("docs/guide/troubleshooting.md"),
    ];
    for e in std::fs::read_dir(root.join("docs/start")).unwrap() {
        pages.push(e.unwrap().path());
    }
    for p in pages {
        let text = std::fs::read_to_string(&p).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("<!--") {
                continue; // markers of generated tables, for whoever edits the page
            }
            let b = line.as_bytes();
            for i in 1..b.len().saturating_sub(2) {
                let path_sep = b[i] == b':' && b[i + 1] == b':';
                if path_sep && b[i - 1].is_ascii_alphabetic() && b[i + 2].is_ascii_alphabetic() {
                    panic!(
                        "{}:{}: a Rust path in a user page: {line}",
                        p.display(),
                        n + 1
                    );
                }
            }
            assert!(
                !line.contains("nccl-net-abi.md") && !line.contains("reference generator"),
                "{}:{}: cites a file the repository lacks: {line}",
                p.display(),
                n + 1
            );
        }
    }
}
