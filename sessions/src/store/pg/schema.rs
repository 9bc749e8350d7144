//! The schema of the PostgreSQL store: its versioned migrations, applied on start by one
//! host at a time, and the oldest server it runs on.

use super::err;
use crate::store::StoreError;

/// The schema, one entry per version; a host applies the ones the database lacks.
/// 1: sessions, transcripts, working copies; 2: `summaries`, the summarizer's answers;
/// 3: `sessions.sent`, the last sent history (`super::encode_sent`); 4: lz4 compression of
/// the message texts; 5: the messages' `tokens` (`super::TokenCounts`).
pub(super) const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    effective_ctx BIGINT NOT NULL,
    turn BIGINT NOT NULL,
    transcript_len BIGINT NOT NULL,
    cleared_at BIGINT NOT NULL,
    expiration_override TEXT,
    created_at BIGINT NOT NULL,
    last_active BIGINT NOT NULL,
    next_copy BIGINT NOT NULL,
    working TEXT NOT NULL,
    version BIGINT NOT NULL
);
CREATE INDEX sessions_last_active ON sessions (last_active);
CREATE TABLE transcript (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    turn BIGINT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE working_copies (
    session_id TEXT NOT NULL,
    key BIGINT NOT NULL,
    seq BIGINT,
    message TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
",
    "
CREATE TABLE summaries (
    key TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
",
    "
ALTER TABLE sessions ADD COLUMN sent TEXT;
",
    // Large texts compressed with lz4 where the server has it (PostgreSQL 14 and later,
    // built with it) rather than pglz, which cost about a tenth of the server's CPU under
    // the serve bench. Values stored before keep their compression; both read back.
    "
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'
               AND 'lz4' = ANY(enumvals)) THEN
        ALTER TABLE transcript ALTER COLUMN message SET COMPRESSION lz4;
        ALTER TABLE working_copies ALTER COLUMN message SET COMPRESSION lz4;
        ALTER TABLE sessions ALTER COLUMN sent SET COMPRESSION lz4;
    END IF;
END
$$;
",
    "
ALTER TABLE transcript ADD COLUMN tokens TEXT;
ALTER TABLE working_copies ADD COLUMN tokens TEXT;
",
];

/// The advisory lock key of migration: hosts starting together migrate once.
pub(super) const MIGRATION_LOCK: i64 = 0x6869_7374_6d69_6772;

/// The oldest PostgreSQL the store runs on: its reads subtract multiranges (14).
pub(super) const OLDEST_SERVER: u32 = 140_000;

/// Refuses a server older than [`OLDEST_SERVER`], naming both versions.
pub(super) async fn check_version(c: &tokio_postgres::Client) -> Result<(), StoreError> {
    let row = c.query_one("SHOW server_version_num", &[]).await.map_err(err)?;
    let version: String = row.get(0);
    match version.parse::<u32>() {
        Ok(number) if number < OLDEST_SERVER => Err(StoreError::new(format!(
            "PostgreSQL {}.{} is too old: the store needs PostgreSQL 14 or later",
            number / 10_000,
            number % 10_000
        ))),
        _ => Ok(()),
    }
}

/// Applies the migrations the database lacks, one host at a time.
pub(super) async fn migrate(c: &mut tokio_postgres::Client) -> Result<(), StoreError> {
    c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(err)?;
    let result = migrate_locked(c).await;
    c.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(err)?;
    result
}

async fn migrate_locked(c: &mut tokio_postgres::Client) -> Result<(), StoreError> {
    {
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS history_schema (version BIGINT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await
        .map_err(err)?;
        let current: i64 = c
            .query_one("SELECT COALESCE(max(version), 0) FROM history_schema", &[])
            .await
            .map_err(err)?
            .get(0);
        let known = MIGRATIONS.len() as i64;
        if current > known {
            return Err(StoreError::new(format!(
                "the database was migrated by a newer history-host (schema {current}, this one knows {known})"
            )));
        }
        for (index, migration) in MIGRATIONS.iter().enumerate().skip(current as usize) {
            let version = index as i64 + 1;
            let tx = c.transaction().await.map_err(err)?;
            tx.batch_execute(migration).await.map_err(err)?;
            tx.execute("INSERT INTO history_schema (version) VALUES ($1)", &[&version])
                .await
                .map_err(err)?;
            tx.commit().await.map_err(err)?;
            tracing::info!("store: schema migrated to version {version}");
        }
        Ok(())
    }
}
