//! The shape of the configuration table: one [`Variable`] row per environment variable, the
//! `variables!` macro that turns the rows into the `Config` struct, its `Default` and the table, and
//! the Markdown rendering of the table for `docs/reference/environment.md`.
//!
//! Depends on `values` only (the `Reject` type). The rows themselves are in `config/mod.rs`.
#![forbid(unsafe_code)]

use super::values::Reject;

/// One environment variable: everything about it that code, logs and documentation need.
pub struct Variable<C: 'static> {
    /// The variable's name.
    pub name: &'static str,
    /// The default as a user would write it ("" = unset); `Config::default()` is this text parsed.
    pub default: &'static str,
    /// The accepted forms, quoted in every error and in the documentation.
    pub forms: &'static str,
    /// What the variable does (Markdown, for the documentation table).
    pub doc: &'static str,
    /// Parses a present, non-blank value into its field of `C`.
    pub(crate) set: fn(&mut C, &str) -> Result<(), Reject>,
    /// The field's current value as the init log writes it.
    pub(crate) show: fn(&C) -> String,
}

/// `parse(text)`, or `T::default()` when `text` is empty (unset) or does not parse. The second can
/// only be a typo in a row's `default`, which the config tests catch (every default must parse).
pub(crate) fn default_value<T: Default>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, Reject>,
) -> T {
    if text.is_empty() {
        return T::default();
    }
    parse(text).unwrap_or_default()
}

/// Calls `parse` on `v`. A plain call would leave a row's closure without a type for its argument;
/// as a closure argument of a generic function it gets one.
pub(crate) fn parse_with<T>(
    v: &str,
    parse: impl Fn(&str) -> Result<T, Reject>,
) -> Result<T, Reject> {
    parse(v)
}

/// Calls `show` on `v` (see [`parse_with`] for why not directly).
pub(crate) fn show_with<T>(v: &T, show: impl Fn(&T) -> String) -> String {
    show(v)
}

/// Declares the configuration struct from its rows: each field is one variable with its name,
/// default (as written in the environment), accepted forms, effect, parser and log form. Generates
/// the struct (field docs from the rows), `Default` (each default parsed), `Config::TABLE` (the rows,
/// in order) and `VARIABLES` (their names).
macro_rules! variables {
    (
        $(#[$meta:meta])*
        pub struct $config:ident {
            $(
                $field:ident: $ty:ty {
                    name: $name:literal,
                    default: $default:literal,
                    forms: $forms:expr,
                    parse: $parse:expr,
                    show: $show:expr,
                    doc: $doc:literal $(,)?
                }
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $config {
            $(
                #[doc = concat!("`", $name, "`: ", $doc)]
                pub $field: $ty,
            )*
        }

        impl Default for $config {
            fn default() -> Self {
                $config {
                    $( $field: table::default_value::<$ty>($default, $parse), )*
                }
            }
        }

        impl $config {
            /// Every variable, in documentation order.
            pub const TABLE: &'static [Variable<$config>] = &[
                $(
                    Variable {
                        name: $name,
                        default: $default,
                        forms: $forms,
                        doc: $doc,
                        set: |c, v| {
                            c.$field = table::parse_with::<$ty>(v, $parse)?;
                            Ok(())
                        },
                        show: |c| table::show_with(&c.$field, $show),
                    },
                )*
            ];
        }

        /// Every variable the configuration reads, in documentation order.
        pub const VARIABLES: &[&str] = &[$($name),*];
    };
}
pub(crate) use variables;

/// Markdown table of `rows` (Variable, Default, Accepted, Meaning), one line per variable.
pub fn markdown<C>(rows: &[Variable<C>]) -> String {
    let mut out = String::from("| Variable | Default | Accepted | Meaning |\n|---|---|---|---|\n");
    for r in rows {
        let default = if r.default.is_empty() {
            "unset".to_string()
        } else {
            format!("`{}`", r.default)
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            r.name,
            default,
            escape(r.forms),
            cell(r.doc)
        ));
    }
    out
}

/// Plain text as a table cell: `<` would start an HTML tag (`<hca>` would vanish), `|` a new cell.
fn escape(text: &str) -> String {
    text.replace('<', "&lt;").replace('|', "\\|")
}

/// Markdown as a table cell: only `|` would break it.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// First line of the generated region of a page.
pub const BEGIN: &str = "<!-- BEGIN generated from the table in src/config/mod.rs: edit the table, then run \
SWITCHLESS_UPDATE_DOCS=1 cargo test --lib config:: -->";
/// Last line of the generated region of a page.
pub const END: &str = "<!-- END generated -->";

/// `page` with the text between its [`BEGIN`] and [`END`] lines replaced by `generated`; `None` when
/// the page lacks either line.
pub fn splice(page: &str, generated: &str) -> Option<String> {
    let start = page.find(BEGIN)? + BEGIN.len();
    let end = start + page[start..].find(END)?;
    Some(format!("{}\n{generated}{}", &page[..start], &page[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_the_generated_region() {
        let page = format!("intro\n{BEGIN}\nold\n{END}\nafter\n");
        assert_eq!(
            splice(&page, "new\n").unwrap(),
            format!("intro\n{BEGIN}\nnew\n{END}\nafter\n")
        );
        assert_eq!(splice("no markers", "x"), None);
    }

    #[test]
    fn cells_escape_what_markdown_would_eat() {
        assert_eq!(escape("<hca>|x"), "&lt;hca>\\|x");
        assert_eq!(cell("`a` | b"), "`a` \\| b");
    }
}
