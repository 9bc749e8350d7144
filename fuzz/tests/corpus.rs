//! Every input of `fuzz/corpus/<target>/` through its target: the seeds, and a regression
//! case for each finding that was fixed.

use std::path::Path;

use history_fuzz::TARGETS;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for target in TARGETS {
        let dir = root.join(target.name);
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            if std::panic::catch_unwind(|| (target.run)(&input)).is_err() {
                panic!("{}: {} panics", target.name, path.display());
            }
            checked += 1;
        }
        assert!(checked > 0, "{} has no corpus", target.name);
    }
}

#[test]
fn the_generator_writes_configurations_the_host_accepts() {
    // The edit target checks only what parses; most generated files must.
    let mut accepted = 0;
    for seed in 0..500u32 {
        let bytes: Vec<u8> = (0..64)
            .map(|i| (seed.wrapping_mul(2_654_435_761).rotate_left(i) >> 3) as u8)
            .collect();
        let generated = history_fuzz::gen::config(&mut history_fuzz::gen::Choices::new(&bytes));
        if history_engine::Config::parse(Path::new("fuzz.toml"), generated.text).is_ok() {
            accepted += 1;
        }
    }
    assert!(accepted > 300, "{accepted} of 500 generated files parse");
}
