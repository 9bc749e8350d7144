//! What every handler shares: the service, the operator's token, the proxy's upstream
//! and its memories. Its own module so the routes and the proxy both take it from here
//! and neither from the other.

use std::sync::Arc;

use history_sessions::Service;

/// What every handler shares.
#[derive(Clone)]
pub struct App {
    pub service: Arc<Service>,
    pub token: Option<Arc<str>>,
    /// The proxy's upstream (docs/proxy.md), when one is configured.
    pub upstream: Option<Arc<crate::upstream::Upstream>>,
    /// The messages stateless proxy calls resent, parsed once (docs/proxy.md#stateless-by-default).
    pub resent: Arc<crate::resent::ResentMessages>,
    /// The same for the Responses wire's items (docs/proxy.md#responses).
    pub resent_items: Arc<crate::resent::ResentItems>,
    /// The same for the Anthropic wire's messages (docs/proxy.md#anthropic-messages).
    pub resent_anthropic: Arc<crate::resent::ResentAnthropic>,
    /// The last proxy requests' numbers, for the inspector page (docs/http-api.md#proxy-traffic).
    pub traffic: Arc<crate::traffic::Traffic>,
}
