//! `docs/reference/cli.md`, rendered from the clap definitions in [`super::Cli`]: the long help of
//! `switchless` and of every subcommand, nested ones included. A test compares the page with this
//! rendering (`SWITCHLESS_UPDATE_DOCS=1` rewrites it), so the page cannot go stale.
#![forbid(unsafe_code)]

/// Every command path of the CLI, depth first: `["switchless"]`, `["switchless", "doctor"]`, …,
/// with the command itself (clap's generated `help` subcommands left out).
pub fn commands() -> Vec<(Vec<String>, clap::Command)> {
    fn walk(path: Vec<String>, cmd: clap::Command, out: &mut Vec<(Vec<String>, clap::Command)>) {
        let subs: Vec<clap::Command> = cmd
            .get_subcommands()
            // Hidden commands (`manpages`, for packaging) are not part of the reference.
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
            .cloned()
            .collect();
        out.push((path.clone(), cmd));
        for sub in subs {
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            walk(p, sub, out);
        }
    }
    let mut cmd = super::command();
    // Render names and usage lines as the binary prints them.
    cmd.build();
    let mut out = Vec::new();
    walk(vec!["switchless".to_string()], cmd, &mut out);
    out
}

/// The Markdown of `docs/reference/cli.md`.
pub fn page() -> String {
    let mut out = String::from(
        "# Command-line reference\n\n\
         <!-- Generated from src/tools/cli/ (clap): edit the help texts there, then run \
         SWITCHLESS_UPDATE_DOCS=1 cargo test --lib tools::cli::reference -->\n\n\
         The `--help` text of `switchless` and of each subcommand, as the binary prints it. Every \
         subcommand ends with examples and its exit status. `switchless` with no arguments prints a short \
         overview of the subcommands and exits with status 2, as for any missing subcommand.\n",
    );
    for (path, mut cmd) in commands() {
        let help = cmd.render_long_help().to_string();
        let help: Vec<&str> = help.lines().map(str::trim_end).collect();
        out.push_str(&format!(
            "\n## `{}`\n\n```text\n{}\n```\n",
            path.join(" "),
            help.join("\n").trim_end()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg_attr(
        miri,
        ignore = "reads docs/ from the host filesystem; Miri isolates it"
    )]
    fn page_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/cli.md");
        let want = super::page();
        if std::env::var_os("SWITCHLESS_UPDATE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        let first_difference = have.lines().zip(want.lines()).find(|(h, w)| h != w);
        assert!(
            have == want,
            "{path} is stale: run SWITCHLESS_UPDATE_DOCS=1 cargo test --lib tools::cli::reference; \
             first difference (page, help): {first_difference:?}"
        );
    }

    #[test]
    fn every_command_is_on_the_page_with_an_example() {
        for (path, mut cmd) in super::commands() {
            let help = cmd.render_long_help().to_string();
            assert!(
                help.contains("Example"),
                "`{}` --help has no Example section",
                path.join(" ")
            );
        }
    }
}
