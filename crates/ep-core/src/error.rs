//! The EP's error type and the `bail!` macro.

use crate::mlx::MlxError;

/// The EP's error: a message that names what failed (node, op, reason). Turned into an ORT
/// status at the C ABI boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }

    /// Prefixes the error with the node it happened in.
    pub fn at_node(self, name: &str, op_type: &str) -> Error {
        Error(format!("node '{name}' ({op_type}): {}", self.0))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<&str> for Error {
    fn from(e: &str) -> Error {
        Error(e.to_owned())
    }
}

impl From<String> for Error {
    fn from(e: String) -> Error {
        Error(e)
    }
}

impl From<MlxError> for Error {
    fn from(e: MlxError) -> Error {
        Error(e.to_string())
    }
}

/// `Err(Error::new(format!(...)))`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => { return Err($crate::Error::new(format!($($arg)*))) };
}
