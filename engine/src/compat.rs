//! What loads where: the `plugin-api` version rule and a layout check that lets the ABI
//! grow (the "ABI stability" section of the `plugin-api` crate docs states both).
//!
//! abi_stable assumes a library is at least as new as the interface it is checked
//! against: for a prefix type (a module, a vtable, the host's services) its layout check
//! accepts a library copy with more trailing fields than the host's and refuses one with
//! fewer. A history host needs the opposite: a plugin built before the host gained a
//! service or an entry point has the older, shorter copy and must still load. So
//! [`check_layout`] accepts exactly the differences that growth makes, and
//! [`check_versions`] refuses plugins built against a newer `plugin-api` than the host's.

use abi_stable::abi_stability::abi_checking::{
    check_layout_compatibility, check_layout_compatibility_with_globals, AbiInstability, AbiInstabilityError,
    AbiInstabilityErrors, CheckingGlobals,
};
use abi_stable::sabi_types::VersionNumber;
use abi_stable::type_layout::{TLFieldOrFunction, TypeLayout};

/// The version rule: a plugin must be built against the host's `0.y` (the major, from
/// 1.0 on) and against the host's `plugin-api` or an older one. `Err` says why not, in a
/// few words (the caller names both versions).
pub fn check_versions(host: VersionNumber, plugin: VersionNumber) -> Result<(), String> {
    let same_series = if host.major == 0 {
        plugin.major == 0 && plugin.minor == host.minor
    } else {
        plugin.major == host.major
    };
    if !same_series {
        return Err(format!(
            "incompatible versions (within 0.y the minor must match): the plugin must be built \
             against plugin-api {}",
            series(host)
        ));
    }
    if (plugin.minor, plugin.patch) > (host.minor, host.patch) {
        return Err(format!(
            "the plugin was built against a newer plugin-api than the host's and may rely on \
             services the host lacks: upgrade the host, or build the plugin against plugin-api {host}"
        ));
    }
    Ok(())
}

/// `0.y` (or `x` from 1.0 on): the versions whose ABI is the same but for growth.
fn series(version: VersionNumber) -> String {
    if version.major == 0 {
        format!("0.{}", version.minor)
    } else {
        format!("{}", version.major)
    }
}

/// The enums that only flow out of plugins (a plugin returns them, the host never hands
/// one to a plugin), by `(package, type name)`: a plugin's copy may lack trailing variants,
/// which it then never sends. docs/abi.md#versioning lists them.
const OUTBOUND_ENUMS: &[(&str, &str)] = &[("plugin-api", "EventKind")];

/// abi_stable's layout check of a plugin's root module against the host's, letting the
/// ABI grow. Passes when the layouts match, and when the plugin is older: the only
/// differences are
///
/// - prefix types below the root module (the host's services, the plugin instance's
///   vtable) of which the plugin's copy lacks trailing fields the host's has. That is
///   safe: a prefix-type accessor checks at run time whether the instance it reads has the
///   field (a plugin never sees a service it does not know; the host calls an entry point
///   a plugin lacks through its default body);
/// - enums that only flow out of plugins ([`OUTBOUND_ENUMS`]: the event kinds) of which
///   the plugin's copy lacks trailing variants the host's has, every variant it has being
///   the host's at the same place. That is safe: the plugin can only send values the host
///   knows.
///
/// An older plugin fails abi_stable's check in the host's direction with those
/// differences only; the check the other way round (the plugin's layout as the interface,
/// the host's as the implementation) then passes — but for the same enums, now seen the
/// other way round — exactly when everything else matches, and it also runs abi_stable's
/// final checks that the failed one skipped (when no enum differs). It runs on checking
/// state of its own: abi_stable keeps, process-wide, one merged description per prefix
/// type it has checked, and would compare every later plugin against the older plugin's
/// copy — refusing the current ones.
///
/// The root module is never allowed to differ: it is frozen, and its accessors panic on a
/// missing field. Anything else — a variant inserted, renamed or reordered, an enum that
/// flows into plugins, a plugin's copy with *more* variants — is refused.
pub fn check_layout(
    host: &'static TypeLayout,
    plugin: &'static TypeLayout,
) -> Result<(), AbiInstabilityErrors> {
    check_layout_growing(host, plugin, OUTBOUND_ENUMS)
}

/// [`check_layout`] with the list of outbound enums given (the unit tests use their own).
fn check_layout_growing(
    host: &'static TypeLayout,
    plugin: &'static TypeLayout,
    outbound: &[(&str, &str)],
) -> Result<(), AbiInstabilityErrors> {
    let errors = match check_layout_compatibility(host, plugin) {
        Ok(()) => return Ok(()),
        Err(errors) => errors,
    };
    // An error with no shallow differences only says that something below it differs.
    let growth = |e: &AbiInstabilityError| {
        e.errs.is_empty() || is_growth(e) || is_enum_growth(e, outbound, Direction::HostFirst)
    };
    if !errors.errors.iter().all(growth) {
        return Err(errors);
    }
    match check_layout_compatibility_with_globals(plugin, host, &CheckingGlobals::new()) {
        Ok(()) => Ok(()),
        Err(reverse) => {
            let enum_growth = |e: &AbiInstabilityError| {
                e.errs.is_empty() || is_enum_growth(e, outbound, Direction::PluginFirst)
            };
            if reverse.errors.iter().all(enum_growth) && reverse.errors.iter().any(|e| !e.errs.is_empty()) {
                Ok(())
            } else {
                Err(reverse)
            }
        }
    }
}

/// Whether one type's differences are the host's copy of a prefix type having trailing
/// fields the plugin's lacks, below the root module.
fn is_growth(error: &AbiInstabilityError) -> bool {
    // The first frame is the root module itself: a difference there is not growth.
    let below_root = error.stack_trace.len() > 1;
    let at_prefix_type = matches!(
        error.stack_trace.last().map(|step| &step.expected),
        Some(TLFieldOrFunction::Field(field)) if field.layout().is_prefix_kind()
    );
    below_root
        && at_prefix_type
        && error.errs.iter().all(|difference| match difference {
            AbiInstability::FieldCountMismatch(counts) => counts.found < counts.expected,
            AbiInstability::Size(sizes) => sizes.found < sizes.expected,
            _ => false,
        })
}

/// Which side a check took as the interface (`expected`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// The host's layout is expected, the plugin's found.
    HostFirst,
    /// The plugin's layout is expected, the host's found.
    PluginFirst,
}

/// Whether one type's differences are an outbound enum of which the plugin's copy has
/// fewer variants than the host's, and nothing else: abi_stable has already compared the
/// variants both copies have (names, field counts, discriminants) and reports any
/// difference there as an error of its own.
fn is_enum_growth(error: &AbiInstabilityError, outbound: &[(&str, &str)], direction: Direction) -> bool {
    let Some(TLFieldOrFunction::Field(field)) = error.stack_trace.last().map(|step| &step.expected) else {
        return false;
    };
    let layout = field.layout();
    let is_outbound = outbound
        .iter()
        .any(|(package, name)| layout.package() == *package && layout.name() == *name);
    is_outbound
        && error.errs.iter().all(|difference| match difference {
            AbiInstability::TooManyVariants(counts) => match direction {
                Direction::HostFirst => counts.found < counts.expected,
                Direction::PluginFirst => counts.found > counts.expected,
            },
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    // `#[sabi_trait]` expands to impls of abi_stable traits inside a const block.
    #![allow(non_local_definitions)]
    // The releases below exist for their layouts only, and `release!` passes an entry
    // point's default body on in braces of its own.
    #![allow(dead_code, unused_braces)]

    use super::*;
    use abi_stable::StableAbi;

    fn version(text: &'static str) -> VersionNumber {
        VersionNumber::new(abi_stable::sabi_types::VersionStrings::new(text)).unwrap()
    }

    #[test]
    fn same_series_older_or_equal_patch_loads() {
        assert_eq!(check_versions(version("0.2.1"), version("0.2.1")), Ok(()));
        assert_eq!(check_versions(version("0.2.1"), version("0.2.0")), Ok(()));
        assert_eq!(check_versions(version("1.4.0"), version("1.2.7")), Ok(()));
    }

    #[test]
    fn another_series_is_refused_naming_the_host_series() {
        let why = check_versions(version("0.2.1"), version("0.3.0")).unwrap_err();
        assert!(
            why.contains("minor must match") && why.contains("plugin-api 0.2"),
            "{why}"
        );
        assert!(check_versions(version("0.2.1"), version("0.1.9")).is_err());
        assert!(check_versions(version("0.2.1"), version("1.2.1")).is_err());
        assert!(check_versions(version("2.0.0"), version("1.9.0")).is_err());
        assert!(!why.contains('\n'), "one line: {why}");
    }

    #[test]
    fn a_newer_patch_is_refused_naming_the_host_version() {
        let why = check_versions(version("0.2.1"), version("0.2.2")).unwrap_err();
        assert!(why.contains("newer plugin-api") && why.contains("0.2.1"), "{why}");
        assert!(check_versions(version("1.2.0"), version("1.3.0")).is_err());
        assert!(!why.contains('\n'), "one line: {why}");
    }

    /// Releases of a small plugin interface shaped like `plugin-api`'s: a frozen root module
    /// whose `instantiate` returns an instance (a `#[sabi_trait]`), the instance's entry points
    /// taking a context that carries host services (a prefix type).
    macro_rules! release {
        (
            $release:ident,
            kinds { $($kind:tt)* }
            levels { $($level:tt)* }
            services { $($service:tt)* }
            entry_points { $($entry_point:tt)* }
            root { $($root:tt)* }
        ) => {
            mod $release {
                use abi_stable::std_types::{RBox, RStr};
                use abi_stable::{sabi_trait, StableAbi};

                #[repr(C)]
                #[derive(StableAbi)]
                #[sabi(kind(Prefix(prefix_ref = ServicesRef)))]
                pub struct Services {
                    pub count: extern "C" fn(RStr<'_>) -> u64,
                    #[sabi(last_prefix_field)]
                    pub log: extern "C" fn(RStr<'_>),
                    $($service)*
                }

                /// Flows out of plugins only, like `EventKind`.
                #[repr(u8)]
                #[derive(StableAbi)]
                pub enum Kind {
                    Removed,
                    Omitted,
                    $($kind)*
                }

                /// Flows into plugins, like `Tokenizer`.
                #[repr(u8)]
                #[derive(StableAbi)]
                pub enum Level {
                    Low,
                    High,
                    $($level)*
                }

                #[repr(C)]
                #[derive(StableAbi)]
                pub struct Out {
                    pub kind: Kind,
                    pub count: u64,
                }

                #[repr(C)]
                #[derive(StableAbi)]
                pub struct Ctx {
                    pub turn: u64,
                    pub level: Level,
                    pub services: ServicesRef,
                }

                #[sabi_trait]
                pub trait Instance {
                    fn process(&self, ctx: &Ctx) -> Out;
                    #[sabi(last_prefix_field)]
                    fn on_switch(&self, ctx: &Ctx) -> u64;
                    $($entry_point)*
                }

                #[repr(C)]
                #[derive(StableAbi)]
                #[sabi(kind(Prefix(prefix_ref = ModRef)))]
                #[sabi(missing_field(panic))]
                pub struct Mod {
                    pub name: extern "C" fn() -> RStr<'static>,
                    #[sabi(last_prefix_field)]
                    pub instantiate: extern "C" fn() -> Instance_TO<'static, RBox<()>>,
                    $($root)*
                }
            }
        };
    }

    release!(first, kinds {} levels {} services {} entry_points {} root {});
    release!(
        with_kind,
        kinds { Changed, }
        levels {}
        services {}
        entry_points {}
        root {}
    );
    release!(
        with_kind_and_service,
        kinds { Changed, }
        levels {}
        services { pub summarize: extern "C" fn(RStr<'_>) -> u64, }
        entry_points {}
        root {}
    );
    release!(
        with_two_kinds,
        kinds { Changed, Summarized, }
        levels {}
        services {}
        entry_points {}
        root {}
    );
    release!(
        with_other_kind,
        kinds { Summarized, }
        levels {}
        services {}
        entry_points {}
        root {}
    );
    release!(
        with_level,
        kinds {}
        levels { Top, }
        services {}
        entry_points {}
        root {}
    );
    release!(
        with_service,
        kinds {}
        levels {}
        services { pub summarize: extern "C" fn(RStr<'_>) -> u64, }
        entry_points {}
        root {}
    );
    release!(
        with_entry_point,
        kinds {}
        levels {}
        services {}
        entry_points { fn on_end(&self) -> u64 { 0 } }
        root {}
    );
    release!(
        with_root_field,
        kinds {}
        levels {}
        services {}
        entry_points {}
        root { pub describe: extern "C" fn() -> RStr<'static>, }
    );
    release!(
        with_changed_service,
        kinds {}
        levels {}
        services { pub summarize: extern "C" fn(RStr<'_>, u64) -> u64, }
        entry_points {}
        root {}
    );

    fn layout<T: StableAbi>() -> &'static TypeLayout {
        <T as StableAbi>::LAYOUT
    }

    #[test]
    fn the_same_layout_passes() {
        let first = layout::<first::ModRef>();
        assert!(check_layout(first, first).is_ok());
    }

    #[test]
    fn a_plugin_built_before_a_new_service_passes_where_abi_stable_refuses_it() {
        let host = layout::<with_service::ModRef>();
        let plugin = layout::<first::ModRef>();
        assert!(check_layout_compatibility(host, plugin).is_err());
        assert!(check_layout(host, plugin).is_ok());
    }

    #[test]
    fn a_plugin_built_before_a_new_entry_point_passes_where_abi_stable_refuses_it() {
        let host = layout::<with_entry_point::ModRef>();
        let plugin = layout::<first::ModRef>();
        assert!(check_layout_compatibility(host, plugin).is_err());
        assert!(check_layout(host, plugin).is_ok());
    }

    #[test]
    fn accepting_an_older_plugin_leaves_abi_stables_global_state_alone() {
        // abi_stable merges the prefix types it checked into process-wide state; a plugin
        // built against the host's own release, checked after an older one, must still pass.
        for host in [
            layout::<with_service::ModRef>(),
            layout::<with_entry_point::ModRef>(),
        ] {
            assert!(check_layout(host, layout::<first::ModRef>()).is_ok());
            assert!(check_layout_compatibility(host, host).is_ok());
            assert!(check_layout(host, host).is_ok());
        }
    }

    #[test]
    fn a_root_module_that_grew_is_refused() {
        let host = layout::<with_root_field::ModRef>();
        let plugin = layout::<first::ModRef>();
        assert!(check_layout(host, plugin).is_err());
    }

    #[test]
    fn a_service_that_differs_is_refused() {
        let service = layout::<with_service::ModRef>();
        let changed = layout::<with_changed_service::ModRef>();
        assert!(check_layout(service, changed).is_err());
        assert!(check_layout(changed, service).is_err());
    }

    /// What the engine's unit tests call the outbound `Kind` above.
    const KIND: &[(&str, &str)] = &[("history-engine", "Kind")];

    fn check(host: &'static TypeLayout, plugin: &'static TypeLayout) -> Result<(), AbiInstabilityErrors> {
        check_layout_growing(host, plugin, KIND)
    }

    #[test]
    fn a_plugin_built_before_a_new_event_kind_passes_where_abi_stable_refuses_it() {
        let host = layout::<with_kind::ModRef>();
        let plugin = layout::<first::ModRef>();
        assert!(check_layout_compatibility(host, plugin).is_err());
        assert!(check(host, plugin).is_ok());
        assert!(check(host, host).is_ok());
        // Two kinds at once, and a kind beside a new service.
        assert!(check(layout::<with_two_kinds::ModRef>(), plugin).is_ok());
        assert!(check(layout::<with_kind_and_service::ModRef>(), plugin).is_ok());
        assert!(check(layout::<with_kind_and_service::ModRef>(), host).is_ok());
    }

    #[test]
    fn an_enum_not_listed_as_outbound_may_not_grow() {
        let host = layout::<with_kind::ModRef>();
        let plugin = layout::<first::ModRef>();
        assert!(check_layout_growing(host, plugin, &[]).is_err());
        assert!(check_layout_growing(host, plugin, &[("history-engine", "Level")]).is_err());
    }

    #[test]
    fn a_kind_the_host_lacks_or_a_different_kind_is_refused() {
        let (first, with_kind) = (layout::<first::ModRef>(), layout::<with_kind::ModRef>());
        // The plugin's copy has a variant the host does not know.
        assert!(check(first, with_kind).is_err());
        // Same count, another variant at the same place.
        assert!(check(with_kind, layout::<with_other_kind::ModRef>()).is_err());
        // The plugin's variants are not the host's first ones.
        assert!(check(
            layout::<with_two_kinds::ModRef>(),
            layout::<with_other_kind::ModRef>()
        )
        .is_err());
    }

    #[test]
    fn an_enum_that_flows_into_plugins_may_not_grow() {
        let host = layout::<with_level::ModRef>();
        let plugin = layout::<first::ModRef>();
        assert!(check(host, plugin).is_err());
        assert!(check(plugin, host).is_err());
    }

    #[test]
    fn the_plugin_api_event_kind_is_the_one_listed() {
        let layout = <plugin_api::EventKind as StableAbi>::LAYOUT;
        assert!(OUTBOUND_ENUMS.contains(&(layout.package().as_str(), layout.name())));
    }
}
