//! Regression tests for faults an adversarial round found in the output check, the wire
//! format and agentctl's writes:
//!
//! - agentctl changing the owner of the configuration it edits.

use e2e_tests::{agentctl, describe, TestConfig};

#[cfg(unix)]
#[test]
fn agentctl_keeps_the_owner_group_and_mode_of_the_config() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let config = TestConfig::new("max_users = 50\n[history]\nchain = [\"default\"]\n");
    // A file this process made is owned by its effective user.
    if std::fs::metadata(&config.path).unwrap().uid() != 0 {
        println!("skipped: agentctl_keeps_the_owner_group_and_mode_of_the_config needs root to give the file another owner");
        return;
    }
    std::os::unix::fs::chown(&config.path, Some(1234), Some(1234)).unwrap();
    std::fs::set_permissions(&config.path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = std::fs::read_to_string(&config.path).unwrap();

    let output = agentctl(&config.path, &["max-users", "7"], &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let after = std::fs::metadata(&config.path).unwrap();
    assert_eq!((after.uid(), after.gid()), (1234, 1234), "owner and group kept");
    assert_eq!(after.permissions().mode() & 0o777, 0o600, "mode kept");
    let now = std::fs::read_to_string(&config.path).unwrap();
    assert_eq!(now, text.replace("max_users = 50", "max_users = 7"));
}
