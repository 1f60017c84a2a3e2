//! `switchless completions SHELL` and `switchless manpages DIR` (what the Debian package ships):
//! generated from the CLI's clap definition, so every subcommand and option appears.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchless"))
}

#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bin().args(["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        for word in ["doctor", "watch", "fleet", "interval"] {
            assert!(text.contains(word), "{shell} completion lacks {word}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bin().arg("manpages").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    for want in [
        "switchless.1",
        "switchless-doctor.1",
        "switchless-watch.1",
        "switchless-bench.1",
    ] {
        assert!(names.iter().any(|n| n == want), "{names:?} lacks {want}");
    }
    // The hidden generator is not a documented command.
    assert!(!names.iter().any(|n| n.contains("manpages")), "{names:?}");
    let doctor = std::fs::read_to_string(dir.path().join("switchless-doctor.1")).unwrap();
    assert!(doctor.contains("fleet"), "{doctor}");
}
