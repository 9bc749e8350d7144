//! The recall service behind `ctx.recall` (docs/abi.md#host-services): a plugin in a
//! session's run asks for the exchanges of the session's whole transcript that match a
//! query, and may put them back into its output under their own identities.
//!
//! The engine knows no store: the session service offers a session's transcript for the
//! time of an operation on it ([`provide`]), by session id, which is what the plugin's
//! [`Context`] carries. A run without one (a stateless call, no session) is answered with
//! nothing. The messages handed out in a run are remembered with the session's offer, so
//! the output check accepts them as it accepts input messages ([`check_stage`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use abi_stable::std_types::{RErr, ROk, RResult, RStr, RString, RVec};
use plugin_api::{Context, Message, RArc, Recalled};

/// Where a session's transcript is searched: the session service's store.
pub trait Transcript: Send + Sync {
    /// The `limit` exchanges of the transcript that best match `query`, best first
    /// (docs/abi.md#host-services); an `Err` says why the transcript could not be read.
    fn recall(&self, query: &str, limit: usize) -> Result<Vec<Recalled>, String>;
}

/// One session's offer: its transcript, how many operations offer it now, and what was
/// handed out from it since the first of them started.
struct Offer {
    transcript: Arc<dyn Transcript>,
    operations: usize,
    handed: Vec<RArc<Message>>,
}

/// How many offers have handed messages out: while none has, the output check of a stage
/// takes no lock (docs/chain.md#the-output-check).
static HANDING: AtomicUsize = AtomicUsize::new(0);

fn offers() -> &'static Mutex<HashMap<String, Offer>> {
    static OFFERS: OnceLock<Mutex<HashMap<String, Offer>>> = OnceLock::new();
    OFFERS.get_or_init(Default::default)
}

/// A session's transcript offered to its plugins until this is dropped.
#[must_use = "the transcript is offered only while this lives"]
pub struct Provided {
    session: String,
}

impl Drop for Provided {
    fn drop(&mut self) {
        let mut offers = offers().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(offer) = offers.get_mut(&self.session) {
            offer.operations -= 1;
            if offer.operations == 0 {
                if !offer.handed.is_empty() {
                    HANDING.fetch_sub(1, Ordering::SeqCst);
                }
                offers.remove(&self.session);
            }
        }
    }
}

/// Offers session `session`'s transcript to the plugins of the runs on it until the
/// answer is dropped: the time of one operation on the session (a turn, a view). Two
/// operations on one session at once share one offer.
pub fn provide(session: &str, transcript: Arc<dyn Transcript>) -> Provided {
    let mut offers = offers().lock().unwrap_or_else(|e| e.into_inner());
    let offer = offers.entry(session.to_string()).or_insert_with(|| Offer {
        transcript: transcript.clone(),
        operations: 0,
        handed: Vec::new(),
    });
    offer.transcript = transcript;
    offer.operations += 1;
    Provided {
        session: session.to_string(),
    }
}

/// The host's answer to a plugin's `recall`, in-process or asked by an isolated plugin's
/// worker (docs/chain.md#isolation).
pub(crate) fn recall(ctx: &Context, query: &str, limit: u64) -> Result<Vec<Recalled>, String> {
    let Some(session) = ctx.session_id.as_ref().into_option().map(|s| s.as_str()) else {
        return Ok(Vec::new());
    };
    let transcript = {
        let offers = offers().lock().unwrap_or_else(|e| e.into_inner());
        offers.get(session).map(|offer| offer.transcript.clone())
    };
    let Some(transcript) = transcript else {
        return Ok(Vec::new());
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    // Reading the store is the host's time, not the plugin's (docs/chain.md#deadline); no
    // panic crosses back into the plugin.
    let found = crate::deadline::in_host_service(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transcript.recall(query, limit)))
            .unwrap_or_else(|_| Err("the host's recall failed (a bug: see the log)".to_string()))
    })?;
    let mut offers = offers().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(offer) = offers.get_mut(session) {
        let was_empty = offer.handed.is_empty();
        offer
            .handed
            .extend(found.iter().flat_map(|r| r.messages.iter().cloned()));
        if was_empty && !offer.handed.is_empty() {
            HANDING.fetch_add(1, Ordering::SeqCst);
        }
    }
    Ok(found)
}

/// The `recall` of the host's services.
pub(crate) extern "C" fn recall_service(
    ctx: &Context,
    query: RStr<'_>,
    limit: u64,
) -> RResult<RVec<Recalled>, RString> {
    match recall(ctx, query.as_str(), limit) {
        Ok(found) => ROk(found.into()),
        Err(reason) => RErr(reason.into()),
    }
}

/// The output check of one stage of a run with context `ctx`: the messages recalled from
/// the session's transcript so far count as input messages
/// ([`plugin_api::check::check_stage_recalled`], docs/chain.md#the-output-check).
pub(crate) fn check_stage(
    ctx: &Context,
    input: &[RArc<Message>],
    input_faults: usize,
    output: &[RArc<Message>],
) -> Result<usize, String> {
    let handed = match ctx.session_id.as_ref().into_option() {
        Some(session) if HANDING.load(Ordering::SeqCst) > 0 => {
            let offers = offers().lock().unwrap_or_else(|e| e.into_inner());
            offers
                .get(session.as_str())
                .map(|offer| offer.handed.clone())
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    plugin_api::check::check_stage_recalled(input, input_faults, output, &handed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use history_wire::chat::history_from_str;
    use plugin_api::{ModelInfo, ROption, Tokenizer};

    /// A transcript of one exchange, numbered 41 and 42 as a store numbers them.
    struct Fixed(Vec<RArc<Message>>);

    impl Transcript for Fixed {
        fn recall(&self, query: &str, limit: usize) -> Result<Vec<Recalled>, String> {
            assert_eq!((query, limit), ("port", 2));
            Ok(vec![Recalled {
                score: 1.5,
                messages: self.0.clone().into(),
            }])
        }
    }

    fn ctx(session: Option<&str>) -> Context {
        Context {
            session_id: session.map(RString::from).into(),
            model: ModelInfo {
                name: "m".into(),
                max_context: 10,
                context_tokens: 1000,
                tokenizer: Tokenizer::Chars4,
                effective_ctx: 10,
            },
            agent_max_ctx: 10,
            effective_ctx: 10,
            turn: 3,
            last_active: ROption::RNone,
            expiration_override: ROption::RNone,
            services: crate::services::SERVICES,
        }
    }

    fn numbered(json: &str, first: u64) -> Vec<RArc<Message>> {
        let mut history = history_from_str(json).unwrap();
        for (offset, message) in history.iter_mut().enumerate() {
            RArc::make_mut(message).set_origin(first + offset as u64);
        }
        history
    }

    #[test]
    fn a_session_run_recalls_from_its_offer_and_the_check_accepts_what_it_handed_out() {
        let old = numbered(
            r#"[{"role":"user","content":"which port?"},{"role":"assistant","content":"6380"}]"#,
            41,
        );
        let input = numbered(r#"[{"role":"user","content":"the port again?"}]"#, 90);
        let session = ctx(Some("recall-test-session"));
        let mut output = old.clone();
        output.extend(input.iter().cloned());

        // Before anything is recalled, a message of the transcript is invented.
        let provided = provide("recall-test-session", Arc::new(Fixed(old.clone())));
        let refused = check_stage(&session, &input, 0, &output).unwrap_err();
        assert!(refused.contains("invented"), "{refused}");

        let services = crate::services::SERVICES;
        let found = (services.recall().expect("this host has recall"))(&session, "port".into(), 2)
            .into_result()
            .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].messages[0].origin(), 41);
        assert_eq!(check_stage(&session, &input, 0, &output), Ok(0));
        // Another session's run does not get this one's messages.
        let other = ctx(Some("another-session"));
        assert!(check_stage(&other, &input, 0, &output).is_err());
        assert!(recall(&other, "port", 2).unwrap().is_empty());

        // Once the operation ends, nothing is offered or accepted.
        drop(provided);
        assert!(recall(&session, "port", 2).unwrap().is_empty());
        assert!(check_stage(&session, &input, 0, &output).is_err());
    }

    #[test]
    fn a_stateless_run_recalls_nothing() {
        assert!(recall(&ctx(None), "port", 2).unwrap().is_empty());
    }
}
