//! The stores the session tests run against: the embedded SQLite file, and PostgreSQL at
//! `HISTORY_TEST_POSTGRES_URL` with a fresh database per test (dropped after it). Where the
//! variable is unset the PostgreSQL tests say loudly that they were skipped; where it is
//! set but the server cannot be reached, they fail.
//!
//! One suite runs against both: a test is a function of [`Kind`], instantiated per store
//! by [`store_tests!`](crate::store_tests).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use history_sessions::store::Store;

use crate::TestConfig;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// The PostgreSQL server the tests use (a URL whose database exists: new databases are
/// created through it), or `None` after saying loudly that PostgreSQL tests are skipped.
/// Under `CI` (set and neither empty, `0` nor `false`) an unset URL fails the test
/// instead: a CI run that skipped PostgreSQL must not pass.
pub fn postgres_url(test: &str) -> Option<String> {
    static WARNED: Once = Once::new();
    match std::env::var("HISTORY_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if in_ci() => panic!(
            "HISTORY_TEST_POSTGRES_URL is unset and CI is set: {test} cannot be skipped in CI \
             (e.g. HISTORY_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test)"
        ),
        _ => {
            // Straight to the process's stderr, not the test harness's captured output.
            WARNED.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** HISTORY_TEST_POSTGRES_URL is unset: the PostgreSQL session tests are SKIPPED ***\n"
                );
            });
            let _ = writeln!(std::io::stderr(), "SKIPPED (no PostgreSQL): {test}");
            None
        }
    }
}

/// Whether this is a CI run: `CI` set, and neither empty, `0` nor `false`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

/// A test's store: a SQLite file in the test's folder, or a fresh PostgreSQL database.
pub struct TestStore {
    pub kind: Kind,
    location: PathBuf,
    /// The server's URL and the database made for this test.
    database: Option<(String, String)>,
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{database}", &base[..host_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// A URL as `(scheme://, user@host:port, /database?query)`.
fn split_authority(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find(['/', '?']).map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end], &url[end..])
}

impl TestStore {
    /// The store of `kind` for a test whose files are in `config`'s folder. A PostgreSQL
    /// store needs `HISTORY_TEST_POSTGRES_URL` (see [`postgres_url`]).
    pub fn new(kind: Kind, config: &TestConfig) -> TestStore {
        match kind {
            Kind::Sqlite => TestStore {
                kind,
                location: config.dir.path().join("sessions.db"),
                database: None,
            },
            Kind::Postgres => {
                let url = postgres_url("a PostgreSQL store").expect("HISTORY_TEST_POSTGRES_URL is set");
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .subsec_nanos();
                let name = format!(
                    "history_test_{}_{}_{nanos}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::SeqCst)
                );
                let mut client = postgres::Client::connect(&url, postgres::NoTls)
                    .unwrap_or_else(|e| panic!("HISTORY_TEST_POSTGRES_URL={url}: cannot connect: {e}"));
                client
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .unwrap_or_else(|e| panic!("{url}: CREATE DATABASE {name}: {e}"));
                TestStore {
                    kind,
                    location: PathBuf::from(with_database(&url, &name)),
                    database: Some((url, name)),
                }
            }
        }
    }

    /// What `--store` takes: the file, or the database's URL.
    pub fn path(&self) -> &Path {
        &self.location
    }

    /// The PostgreSQL server's `host:port`.
    pub fn server_address(&self) -> String {
        let url = self.location.to_string_lossy();
        let (_, authority, _) = split_authority(&url);
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if host_port.contains(':') {
            host_port.to_string()
        } else {
            format!("{host_port}:5432")
        }
    }

    /// What `--store` takes to reach this database through 127.0.0.1:`port` (a
    /// [`Link`](crate::link::Link) to [`server_address`](Self::server_address)).
    pub fn path_via(&self, port: u16) -> PathBuf {
        let url = self.location.to_string_lossy();
        let (scheme, authority, rest) = split_authority(&url);
        let user = authority.rsplit_once('@').map(|(user, _)| format!("{user}@"));
        PathBuf::from(format!(
            "{scheme}{}127.0.0.1:{port}{rest}",
            user.unwrap_or_default()
        ))
    }

    /// The store opened in the test process, to look at what it holds.
    pub fn open(&self) -> Box<dyn Store> {
        history_sessions::store::open(
            &self.location,
            std::time::Duration::from_secs(10),
            Default::default(),
        )
        .unwrap()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Some((url, name)) = &self.database {
            if let Ok(mut client) = postgres::Client::connect(url, postgres::NoTls) {
                let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// Instantiates each named test `fn NAME(kind: Kind)` once per store: `NAME::sqlite` and
/// `NAME::postgres` (skipped, saying so, without `HISTORY_TEST_POSTGRES_URL`; failed
/// instead under `CI=true`).
#[macro_export]
macro_rules! store_tests {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn sqlite() {
                    super::$name($crate::store::Kind::Sqlite)
                }

                #[test]
                fn postgres() {
                    if $crate::store::postgres_url(concat!(module_path!(), "::postgres")).is_some() {
                        super::$name($crate::store::Kind::Postgres)
                    }
                }
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_gets_another_database() {
        use super::with_database;
        assert_eq!(
            with_database("postgres://u@h:5432/test", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(
            super::split_authority("postgres://u@h:5432/x?a=b"),
            ("postgres://", "u@h:5432", "/x?a=b")
        );
        assert_eq!(
            with_database("postgres://h/t?sslmode=disable", "x"),
            "postgres://h/x?sslmode=disable"
        );
    }
}
