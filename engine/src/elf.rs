//! The check a library file passes before it is mapped: it must be a complete ELF shared
//! library for this host.
//!
//! The dynamic loader maps a library's segments as its program headers describe them. When
//! the file is shorter than they say — a half-finished copy into `plugin_dir`, a truncated
//! download — the first touch of a page past the end of the file raises SIGBUS, which ends
//! the process with no message and no way to recover. So the headers are read here, with
//! plain reads, and every segment and section is checked to end within the file.
//!
//! Written by hand rather than with `object` or `goblin`: the check reads three tables of
//! fixed-size records (the file header, the program headers, the section headers) and
//! compares offsets with the file size. A parsing crate would bring a dependency for the
//! decoding of a dozen integers, and the comparisons would still be ours to write.
//!
//! ELF platforms only; elsewhere [`check`] accepts every file and the loader's own checks
//! apply.

use std::path::Path;

/// Checks that `path` is a complete ELF shared library for this host. The error is the
/// reason, in a few words ("truncated: segment ends at byte 1531440 of a 10000-byte file").
#[cfg(not(any(windows, target_vendor = "apple")))]
pub fn check(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileExt;

    // A FIFO or a device would block or lie about its size: only regular files are read.
    let meta = std::fs::metadata(path).map_err(|err| format!("cannot open it: {err}"))?;
    if !meta.is_file() {
        return Err("cannot open it: not a regular file".into());
    }
    let file = std::fs::File::open(path).map_err(|err| format!("cannot open it: {err}"))?;
    let size = file
        .metadata()
        .map_err(|err| format!("cannot open it: {err}"))?
        .len();
    let read = |offset: u64, len: usize| -> Result<Vec<u8>, String> {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset)
            .map_err(|err| format!("cannot read it: {err}"))?;
        Ok(buf)
    };
    let truncated =
        |what: &str, end: u64| format!("truncated: {what} ends at byte {end} of a {size}-byte file");

    let ident = read(0, 16.min(size as usize))?;
    if ident.len() < 16 || &ident[..4] != b"\x7fELF" {
        return Err("cannot open it: not a shared library (no ELF header)".into());
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        class => return Err(format!("not a shared library (unknown ELF class {class})")),
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        data => return Err(format!("not a shared library (unknown ELF byte order {data})")),
    };
    if wide != cfg!(target_pointer_width = "64") {
        return Err(format!(
            "built for a {}-bit target, this host is {}-bit",
            if wide { 64 } else { 32 },
            if wide { 32 } else { 64 }
        ));
    }
    if little != cfg!(target_endian = "little") {
        return Err("built for a target of the other byte order".into());
    }

    // Field offsets and record sizes of the two classes (the ELF specification's tables).
    let header_size: u64 = if wide { 64 } else { 52 };
    if size < header_size {
        return Err(truncated("the ELF header", header_size));
    }
    let header = read(0, header_size as usize)?;
    let field = |buf: &[u8], at: usize, len: usize| -> u64 {
        let bytes = &buf[at..at + len];
        let mut value = 0u64;
        for i in 0..len {
            let byte = if little { bytes[len - 1 - i] } else { bytes[i] };
            value = value << 8 | u64::from(byte);
        }
        value
    };
    let word = if wide { 8 } else { 4 };
    let e_type = field(&header, 16, 2);
    let (e_phoff, e_shoff) = if wide {
        (field(&header, 32, 8), field(&header, 40, 8))
    } else {
        (field(&header, 28, 4), field(&header, 32, 4))
    };
    let at = if wide { 54 } else { 42 };
    let (e_phentsize, e_phnum) = (field(&header, at, 2), field(&header, at + 2, 2));
    let (e_shentsize, e_shnum) = (field(&header, at + 4, 2), field(&header, at + 6, 2));

    const ET_DYN: u64 = 3;
    if e_type != ET_DYN {
        let what = match e_type {
            1 => "an object file",
            2 => "an executable",
            4 => "a core dump",
            _ => "an ELF file of another type",
        };
        return Err(format!("not a shared library ({what})"));
    }

    // Program headers: what the loader maps.
    let (ph_size, ph_offset, ph_filesz) = if wide { (56, 8, 32) } else { (32, 4, 16) };
    if e_phnum == 0 || e_phnum == 0xffff || e_phentsize < ph_size {
        return Err("not a shared library (no usable program headers)".into());
    }
    let ph_end = e_phoff.saturating_add(e_phnum * e_phentsize);
    if ph_end > size {
        return Err(truncated("the program header table", ph_end));
    }
    let mut loads = 0;
    for i in 0..e_phnum {
        let entry = read(e_phoff + i * e_phentsize, ph_size as usize)?;
        const PT_NULL: u64 = 0;
        const PT_LOAD: u64 = 1;
        let p_type = field(&entry, 0, 4);
        if p_type == PT_NULL {
            continue;
        }
        loads += usize::from(p_type == PT_LOAD);
        let end = field(&entry, ph_offset, word).saturating_add(field(&entry, ph_filesz, word));
        if end > size {
            return Err(truncated("segment", end));
        }
    }
    if loads == 0 {
        return Err("not a shared library (nothing to load)".into());
    }

    // Section headers: not mapped, but a library whose sections run past its end is not
    // whole either (the tail of a truncated debug build is its debug sections).
    if e_shoff == 0 {
        return Ok(()); // stripped of its section headers: nothing more to check
    }
    let (sh_size, sh_offset, sh_len) = if wide { (64, 24, 32) } else { (40, 16, 20) };
    if e_shentsize < sh_size {
        return Err("damaged: the section headers are too small".into());
    }
    let first_end = e_shoff.saturating_add(e_shentsize);
    if first_end > size {
        return Err(truncated("the section header table", first_end));
    }
    // More than 0xff00 sections: the count is section 0's size.
    let count = match e_shnum {
        0 => field(&read(e_shoff, sh_size as usize)?, sh_len, word),
        n => n,
    };
    let sh_end = e_shoff.saturating_add(count.saturating_mul(e_shentsize));
    if sh_end > size {
        return Err(truncated("the section header table", sh_end));
    }
    for i in 0..count {
        let entry = read(e_shoff + i * e_shentsize, sh_size as usize)?;
        const SHT_NULL: u64 = 0;
        const SHT_NOBITS: u64 = 8;
        if matches!(field(&entry, 4, 4), SHT_NULL | SHT_NOBITS) {
            continue;
        }
        let end = field(&entry, sh_offset, word).saturating_add(field(&entry, sh_len, word));
        if end > size {
            return Err(truncated("section", end));
        }
    }
    Ok(())
}

#[cfg(any(windows, target_vendor = "apple"))]
pub fn check(_path: &Path) -> Result<(), String> {
    Ok(())
}

#[cfg(all(
    test,
    target_os = "linux",
    target_pointer_width = "64",
    target_endian = "little"
))]
mod tests {
    use super::check;

    /// A minimal ELF64 shared library image: the header, one PT_LOAD of the first `load`
    /// bytes, and (with `sections`) a section header table of a null section and one
    /// section of `section` bytes at 256, placed at the end.
    fn image(load: u64, section: Option<u64>) -> Vec<u8> {
        let mut bytes = vec![0u8; 512];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2; // 64-bit
        bytes[5] = 1; // little-endian
        bytes[6] = 1; // version
        bytes[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        bytes[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        bytes[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        bytes[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        bytes[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        bytes[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
                                                            // The program header at 64: PT_LOAD, offset 0, `load` bytes.
        bytes[64..68].copy_from_slice(&1u32.to_le_bytes());
        bytes[64 + 32..64 + 40].copy_from_slice(&load.to_le_bytes());
        bytes[64 + 40..64 + 48].copy_from_slice(&load.to_le_bytes());
        if let Some(len) = section {
            let shoff = bytes.len() as u64;
            bytes[40..48].copy_from_slice(&shoff.to_le_bytes());
            bytes[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
            bytes[60..62].copy_from_slice(&2u16.to_le_bytes()); // e_shnum
            bytes.extend_from_slice(&[0u8; 64]); // the null section
            let mut header = [0u8; 64];
            header[4..8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
            header[24..32].copy_from_slice(&256u64.to_le_bytes());
            header[32..40].copy_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(&header);
        }
        bytes
    }

    fn check_bytes(bytes: &[u8]) -> Result<(), String> {
        let dir = tempfile_dir();
        let path = dir.join("libhistory_plugin_t.so");
        std::fs::write(&path, bytes).unwrap();
        let result = check(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "history-elf-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_complete_library_passes() {
        assert_eq!(check_bytes(&image(512, None)), Ok(()));
        assert_eq!(check_bytes(&image(512, Some(256))), Ok(()));
    }

    #[test]
    fn a_truncated_library_is_refused_with_where_it_ends() {
        let whole = image(512, Some(256));
        assert_eq!(
            check_bytes(&whole[..100]),
            Err("truncated: the program header table ends at byte 120 of a 100-byte file".into())
        );
        assert_eq!(
            check_bytes(&whole[..300]),
            Err("truncated: segment ends at byte 512 of a 300-byte file".into())
        );
        assert_eq!(
            check_bytes(&whole[..whole.len() - 1]),
            Err("truncated: the section header table ends at byte 640 of a 639-byte file".into())
        );
        assert_eq!(
            check_bytes(&image(512, Some(1000))),
            Err("truncated: section ends at byte 1256 of a 640-byte file".into())
        );
        assert_eq!(
            check_bytes(&whole[..10]),
            Err("cannot open it: not a shared library (no ELF header)".into())
        );
        assert_eq!(
            check_bytes(&whole[..20]),
            Err("truncated: the ELF header ends at byte 64 of a 20-byte file".into())
        );
    }

    #[test]
    fn other_files_are_refused() {
        assert_eq!(
            check_bytes(b"not a library"),
            Err("cannot open it: not a shared library (no ELF header)".into())
        );
        let mut executable = image(512, None);
        executable[16] = 2;
        assert_eq!(
            check_bytes(&executable),
            Err("not a shared library (an executable)".into())
        );
        let mut huge = image(512, None);
        huge[64 + 8..64 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            check_bytes(&huge),
            Err(format!(
                "truncated: segment ends at byte {} of a 512-byte file",
                u64::MAX
            ))
        );
    }
}
