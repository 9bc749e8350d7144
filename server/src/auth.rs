//! The operator's token: where it comes from and how a request's is checked.

use axum::http::HeaderMap;
use history_engine::Config;

/// The operator's token: the file named by `operator_token_file` (its first line),
/// otherwise `HISTORY_OPERATOR_TOKEN`; `None` when neither is set.
pub fn operator_token(config: &Config) -> Result<Option<String>, String> {
    let token = match &config.operator_token_file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read operator_token_file {}: {e}", file.display()))?;
            let token = text.lines().next().unwrap_or("").trim().to_string();
            if token.is_empty() {
                return Err(format!("operator_token_file {} is empty", file.display()));
            }
            Some(token)
        }
        None => match std::env::var("HISTORY_OPERATOR_TOKEN") {
            Ok(token) if !token.trim().is_empty() => Some(token.trim().to_string()),
            _ => None,
        },
    };
    Ok(token)
}

/// Equal in time that depends only on the lengths, never on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Why a request is not the operator's.
pub enum Denied {
    /// No `Authorization: Bearer` header (401).
    Missing,
    /// A token that is not the operator's, or none is configured (403).
    Wrong,
}

/// Checks a request's bearer token against the operator's. The token is never logged.
pub fn check(headers: &HeaderMap, token: Option<&str>) -> Result<(), Denied> {
    let Some(given) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Err(Denied::Missing);
    };
    match token {
        Some(token) if constant_time_eq(given.trim().as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(Denied::Wrong),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
