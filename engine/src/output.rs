//! The output of a binary that loads plugins. Plugins run in the host's process and share
//! its file descriptors: a plugin's `println!` writes to fd 1, a plugin can close it, and
//! a plugin's `exit(0)` ends the process as if all went well. This module is what keeps
//! the binaries' promises anyway:
//!
//! - [`Output::take_stdout`] keeps the real stdout for the binary's own output, on a
//!   descriptor of its own, and points fd 1 at stderr: whatever else writes to stdout
//!   lands on stderr, and closing fd 1 no longer touches the output;
//! - [`Output::write_all`] reports a failed write (a full disk, an I/O error) so the
//!   binary can exit non-zero, and treats a closed pipe (`| head`) as the reader's choice:
//!   the rest is dropped quietly;
//! - [`ExitGuard`] turns an exit the binary did not make (a plugin calling `exit`) into a
//!   failure: one line on stderr and [`PLUGIN_EXIT_STATUS`];
//! - [`error_line`] writes a binary's one-line error without ever panicking.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use plugin_api::echo;

/// The exit status when the output cannot be written (not a closed pipe: that is 0).
pub const WRITE_FAILED_STATUS: u8 = 5;

/// The exit status when something other than the binary ended the process before the
/// output was written: a plugin calling `exit`.
pub const PLUGIN_EXIT_STATUS: i32 = 6;

/// The exit status of a command-line usage error (sysexits' `EX_USAGE`).
pub const USAGE_STATUS: u8 = 64;

/// The binary's stdout, kept apart from fd 1.
#[derive(Debug)]
pub struct Output {
    /// `None` when the process started with fd 1 closed.
    file: Option<File>,
    /// The reader closed the pipe: later writes are dropped.
    reader_gone: bool,
}

impl Output {
    /// Takes stdout for the binary's own output: duplicates fd 1 onto a new descriptor
    /// (close-on-exec) that only this `Output` writes to, then points fd 1 at stderr (at
    /// `/dev/null` if stderr is closed), for the rest of the process. Call it once, after
    /// the command line is parsed (`--help` prints to stdout) and before any plugin is
    /// loaded.
    pub fn take_stdout() -> Output {
        let _ = io::stdout().flush();
        // SAFETY: plain descriptor calls; the new descriptor is owned by the File alone.
        let file = unsafe {
            let fd = libc::fcntl(libc::STDOUT_FILENO, libc::F_DUPFD_CLOEXEC, 3);
            let file = (fd >= 0).then(|| File::from_raw_fd(fd));
            if libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) < 0 {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if null >= 0 {
                    libc::dup2(null, libc::STDOUT_FILENO);
                    libc::close(null);
                }
            }
            file
        };
        Output {
            file,
            reader_gone: false,
        }
    }

    /// Writes all of `bytes`. A closed pipe is not an error: the reader wanted no more,
    /// and this and every later write are dropped. Any other failure is returned.
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.reader_gone {
            return Ok(());
        }
        let Some(file) = self.file.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "stdout was closed when the process started",
            ));
        };
        match file.write_all(bytes) {
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => {
                self.reader_gone = true;
                Ok(())
            }
            other => other,
        }
    }
}

static ARMED: AtomicBool = AtomicBool::new(false);
static PROGRAM: OnceLock<&'static str> = OnceLock::new();

extern "C" fn on_exit() {
    if ARMED.load(Ordering::SeqCst) {
        let program = PROGRAM.get().copied().unwrap_or("history-host");
        let line = format!("{program}: a plugin ended the process before the output was written\n");
        // SAFETY: write(2) and _exit(2) are safe to call at exit; _exit ends the process
        // here with the guard's status, whatever status exit was called with.
        unsafe {
            libc::write(libc::STDERR_FILENO, line.as_ptr().cast(), line.len());
            libc::_exit(PLUGIN_EXIT_STATUS);
        }
    }
}

/// Makes an exit the binary did not make a failure. While armed, a process exit (a
/// plugin's `std::process::exit(0)`, or `exit` from any code in the process) writes
/// `PROGRAM: a plugin ended the process before the output was written` to stderr and ends
/// the process with [`PLUGIN_EXIT_STATUS`]. The binary disarms it when it is about to end
/// the process itself. What no exit handler sees — an abort, a signal, a plugin that never
/// returns — only process isolation contains.
#[derive(Debug)]
pub struct ExitGuard(());

impl ExitGuard {
    /// Arms the guard (the handler is registered once per process).
    pub fn arm(program: &'static str) -> ExitGuard {
        static REGISTERED: OnceLock<()> = OnceLock::new();
        let _ = PROGRAM.set(program);
        REGISTERED.get_or_init(|| {
            // SAFETY: registers a plain extern "C" function.
            unsafe {
                libc::atexit(on_exit);
            }
        });
        ARMED.store(true, Ordering::SeqCst);
        ExitGuard(())
    }

    /// The binary ends the process itself from here on (it has written its output, or
    /// its one-line error).
    pub fn disarm(&self) {
        ARMED.store(false, Ordering::SeqCst);
    }
}

/// Writes `PROGRAM: MESSAGE` as one line on stderr (control characters escaped), ignoring
/// a failure to write it: there is nowhere left to report that, and `eprintln!` would
/// panic.
pub fn error_line(program: &str, message: &str) {
    let line = format!("{program}: {}\n", echo::line(message));
    let _ = io::stderr().lock().write_all(line.as_bytes());
}
