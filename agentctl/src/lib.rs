//! `agentctl`'s library: the layout-keeping, validated, atomic edits of
//! `plugins-enabled.toml` ([`edit`], written through [`write`]) and the rendering of its
//! reports ([`report`]). The session service's runtime commands (`!maxctx` and the like)
//! write the configuration through the same [`edit::run`].

pub mod edit;
pub mod install;
pub mod report;
pub mod write;
