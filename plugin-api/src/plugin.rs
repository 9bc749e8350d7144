// `#[sabi_trait]` expands to impls of abi_stable traits inside a const block.
#![allow(non_local_definitions)]

//! The plugin interface: the [`HistoryPlugin`] trait a plugin implements, the root module
//! the host loads (docs/abi.md#the-root-module) and the glue [`export_plugin!`](crate::export_plugin) emits.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    prefix_type::PrefixTypeTrait,
    sabi_trait,
    sabi_trait::TD_Opaque,
    sabi_types::VersionStrings,
    std_types::{RArc, RBox, RErr, ROk, RResult, RSlice, RStr, RString, RVec},
    StableAbi,
};

use crate::config::ConfigError;
use crate::context::{Context, LoadContext, ModelInfo};
use crate::event::Output;
use crate::message::Message;

/// A history plugin. Implement this, then call [`export_plugin!`](crate::export_plugin).
pub trait HistoryPlugin: Sized + Send + Sync + 'static {
    /// The chain identifier, e.g. `"token_budget"` (snake case, unique).
    const NAME: &'static str;
    /// The plugin's own semver version: use `env!("CARGO_PKG_VERSION")`.
    const VERSION: &'static str;
    /// A one-line summary for `agentctl plugins` and `history-list`.
    const SUMMARY: &'static str;
    /// The config keys it accepts, each with a short meaning.
    const CONFIG_KEYS: &'static [(&'static str, &'static str)] = &[];

    /// Builds an instance from the plugin's config table, validating it: an unknown key
    /// or a bad value is an error naming the key (see [`ConfigTable`](crate::ConfigTable)).
    fn new(load: &LoadContext) -> Result<Self, ConfigError>;

    /// Returns the new history. Never mutates the input: share what passes through.
    fn process(&self, history: &[RArc<Message>], ctx: &Context) -> Result<Output, String>;

    /// Called when the session's model changes; `ctx` already describes `new`.
    /// The default returns the history unchanged.
    fn on_model_switch(
        &self,
        history: &[RArc<Message>],
        ctx: &Context,
        old: &ModelInfo,
        new: &ModelInfo,
    ) -> Result<Output, String> {
        let _ = (ctx, old, new);
        Ok(Output::unchanged(history))
    }
}

/// A plugin's description, as `describe` returns it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct Description {
    pub summary: RString,
    /// (key, meaning) pairs.
    pub config_keys: RVec<ConfigKey>,
}

/// One config key a plugin accepts.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct ConfigKey {
    pub name: RString,
    pub meaning: RString,
}

/// A live plugin instance, as the host holds it.
///
/// Its vtable is a prefix type: the methods up to `on_model_switch` are in every plugin of
/// this 0.y. An optional entry point is added after it, in a patch release, **with a
/// default body** (abi_stable runs that body for a plugin whose vtable predates the
/// method), together with a defaulted method on [`HistoryPlugin`] and its forwarding in
/// `Guarded` below. See the crate docs, "ABI stability".
#[sabi_trait]
pub trait PluginInstance: Send + Sync {
    fn process(&self, history: RSlice<'_, RArc<Message>>, ctx: &Context) -> RResult<Output, RString>;

    #[sabi(last_prefix_field)]
    fn on_model_switch(
        &self,
        history: RSlice<'_, RArc<Message>>,
        ctx: &Context,
        old: &ModelInfo,
        new: &ModelInfo,
    ) -> RResult<Output, RString>;
}

/// The boxed, ABI-stable instance handed to the host.
pub type PluginBox = PluginInstance_TO<'static, RBox<()>>;

/// The root module every plugin library exports (docs/abi.md#the-root-module).
///
/// **Frozen.** Its layout is checked at load; a host whose root module gained a field
/// refuses every plugin built before it. New capabilities go behind the prefix-type
/// boundaries of what it hands out ([`HostServices`](crate::HostServices), the
/// instance's vtable) — never new fields here.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    pub name: extern "C" fn() -> RStr<'static>,
    pub version: extern "C" fn() -> RStr<'static>,
    pub describe: extern "C" fn() -> Description,
    #[sabi(last_prefix_field)]
    pub new: extern "C" fn(&LoadContext) -> RResult<PluginBox, ConfigError>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "history_plugin";
    const NAME: &'static str = "history_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

thread_local! {
    /// Where the last panic on this thread happened, recorded by the plugin's panic hook.
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the plugin's (own copy of std's) panic hook: a panic is reported to the host
/// as an error value, so it must not also print a message and backtrace to stderr.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
            PANIC_LOCATION.with(|cell| *cell.borrow_mut() = location);
        }));
    });
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    let message = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    };
    match PANIC_LOCATION.with(|cell| cell.borrow_mut().take()) {
        Some(location) => format!("panicked at {location}: {message}"),
        None => format!("panicked: {message}"),
    }
}

/// Runs `f`, turning a panic into an error value (docs/abi.md#rules).
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> RResult<T, RString> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => ROk(value),
        Ok(Err(message)) => RErr(message.into()),
        Err(payload) => RErr(panic_message(payload).into()),
    }
}

/// Adapts a [`HistoryPlugin`] to the ABI, catching panics in every entry point.
struct Guarded<P>(P);

impl<P: HistoryPlugin> PluginInstance for Guarded<P> {
    fn process(&self, history: RSlice<'_, RArc<Message>>, ctx: &Context) -> RResult<Output, RString> {
        guarded(|| self.0.process(history.as_slice(), ctx))
    }

    fn on_model_switch(
        &self,
        history: RSlice<'_, RArc<Message>>,
        ctx: &Context,
        old: &ModelInfo,
        new: &ModelInfo,
    ) -> RResult<Output, RString> {
        guarded(|| self.0.on_model_switch(history.as_slice(), ctx, old, new))
    }
}

extern "C" fn name_of<P: HistoryPlugin>() -> RStr<'static> {
    RStr::from_str(P::NAME)
}

extern "C" fn version_of<P: HistoryPlugin>() -> RStr<'static> {
    RStr::from_str(P::VERSION)
}

extern "C" fn describe_of<P: HistoryPlugin>() -> Description {
    Description {
        summary: P::SUMMARY.into(),
        config_keys: P::CONFIG_KEYS
            .iter()
            .map(|(name, meaning)| ConfigKey {
                name: (*name).into(),
                meaning: (*meaning).into(),
            })
            .collect(),
    }
}

extern "C" fn new_of<P: HistoryPlugin>(load: &LoadContext) -> RResult<PluginBox, ConfigError> {
    match catch_unwind(AssertUnwindSafe(|| P::new(load))) {
        Ok(Ok(plugin)) => ROk(PluginInstance_TO::from_value(Guarded(plugin), TD_Opaque)),
        Ok(Err(err)) => RErr(err),
        Err(payload) => RErr(ConfigError::new("", panic_message(payload))),
    }
}

/// Builds the root module of plugin `P`. Called once, by the code
/// [`export_plugin!`](crate::export_plugin) emits, when the host loads the library.
#[doc(hidden)]
pub fn root_module<P: HistoryPlugin>() -> PluginModRef {
    install_panic_hook();
    PluginMod {
        name: name_of::<P>,
        version: version_of::<P>,
        describe: describe_of::<P>,
        new: new_of::<P>,
    }
    .leak_into_prefix()
}

/// Exports a [`HistoryPlugin`] as the library's root module. Call it once, at the crate
/// root of a `cdylib` crate: `plugin_api::export_plugin!(MyPlugin);`
///
/// The plugin must be built with `panic = "unwind"` (the default): a panic becomes an
/// error the host handles, where `abort` would take the host down. Building with
/// `panic = "abort"` is a compile error.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[cfg(panic = "abort")]
        compile_error!(
            "history plugins must be built with panic = \"unwind\": a plugin's panic must \
             become an error value, not abort the host process"
        );

        // The symbol abi_stable's loader looks for (abi_stable::library::ROOT_MODULE_LOADER_NAME).
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::__private::LibHeader = {
            extern "C" fn __history_plugin_root_module() -> $crate::__private::RootModuleResult {
                $crate::__private::__call_root_module_loader($crate::__private::root_module::<$plugin>)
            }
            // SAFETY: the constructor returns the root module of type `PluginModRef`.
            unsafe {
                $crate::__private::LibHeader::from_constructor::<$crate::PluginModRef>(
                    __history_plugin_root_module,
                    $crate::__private::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn export_macro_uses_the_loader_symbol_name() {
        assert_eq!(
            "_1as_0lib_1header_0root_bmodule_bloader",
            abi_stable::library::ROOT_MODULE_LOADER_NAME
        );
    }
}
