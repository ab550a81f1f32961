//! Why a master config cannot be used.

use std::fmt;
use std::path::PathBuf;

/// A master config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// An explicit config file that does not exist.
    Missing {
        /// The file.
        file: PathBuf,
        /// How it was chosen ([`crate::Source::how`]).
        how: &'static str,
    },
    /// A file that cannot be read.
    Io {
        /// The file.
        file: PathBuf,
        /// Why.
        why: String,
    },
    /// A file that is not valid YAML (or not what Salt's loader accepts).
    Syntax {
        /// The file.
        file: PathBuf,
        /// 1-based.
        line: usize,
        /// 1-based.
        col: usize,
        /// What is wrong.
        why: String,
    },
    /// A file whose document is not a mapping.
    NotAMapping {
        /// The file.
        file: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// An option with a value of the wrong type.
    Type {
        /// The file.
        file: PathBuf,
        /// 1-based line of the value.
        line: usize,
        /// The option.
        key: String,
        /// What Salt needs.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
    /// Includes that include each other.
    Cycle {
        /// The file included again.
        file: PathBuf,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Missing { file, how } => {
                write!(f, "master config {} ({how}): no such file", file.display())
            }
            ConfigError::Io { file, why } => {
                write!(f, "master config {}: cannot read: {why}", file.display())
            }
            ConfigError::Syntax {
                file,
                line,
                col,
                why,
            } => write!(
                f,
                "master config {}:{line}:{col}: not valid YAML: {why}",
                file.display()
            ),
            ConfigError::NotAMapping { file, found } => write!(
                f,
                "master config {}: the document is {found}; Salt needs a mapping of options",
                file.display()
            ),
            ConfigError::Type {
                file,
                line,
                key,
                expected,
                found,
            } => write!(
                f,
                "master config {}:{line}: {key}: expected {expected}, found {found}",
                file.display()
            ),
            ConfigError::Cycle { file } => write!(
                f,
                "master config {}: included again by its own includes (a cycle)",
                file.display()
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
