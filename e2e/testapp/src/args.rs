//! Hand-written parsing of `--flag value`, `--flag=value` and `--switch`
//! arguments: enough for three subcommands without a dependency.

use std::str::FromStr;

/// Walks the arguments of one subcommand. Every accessor removes what it
/// consumed; [`Parser::finish`] rejects whatever is left.
pub struct Parser {
    /// Arguments not consumed yet.
    rest: Vec<String>,
}

impl Parser {
    /// A parser over the arguments after the subcommand name.
    pub fn new(args: &[String]) -> Self {
        Parser { rest: args.to_vec() }
    }

    /// Removes `--name` if present; true when it was given.
    pub fn switch(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| a != name);
        self.rest.len() != before
    }

    /// Removes `--name VALUE` / `--name=VALUE` (the last one wins) and parses
    /// VALUE; `None` when absent.
    pub fn value<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        let mut found: Option<String> = None;
        let mut i = 0;
        let prefix = format!("{name}=");
        while i < self.rest.len() {
            if self.rest[i] == name {
                if i + 1 >= self.rest.len() {
                    return Err(format!("{name} needs a value"));
                }
                found = Some(self.rest.remove(i + 1));
                self.rest.remove(i);
            } else if let Some(v) = self.rest[i].strip_prefix(&prefix) {
                found = Some(v.to_string());
                self.rest.remove(i);
            } else {
                i += 1;
            }
        }
        match found {
            None => Ok(None),
            Some(raw) => raw.parse::<T>().map(Some).map_err(|e| format!("{name} {raw:?}: {e}")),
        }
    }

    /// Fails when any argument was not consumed.
    pub fn finish(self) -> Result<(), String> {
        match self.rest.first() {
            None => Ok(()),
            Some(arg) => Err(format!("unexpected argument {arg:?}")),
        }
    }
}
