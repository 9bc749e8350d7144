//! Frames over a worker's pipes (docs/chain.md#isolation): each frame is its length (4
//! bytes, little endian, counting what follows), one byte saying what it is, and its
//! payload ([`super::codec`]). The host reads under a deadline: it waits for the pipe with
//! `poll`, so a worker that does not answer in time costs no thread.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::codec::Encoder;

/// Host → worker: load the library and build the plugin (path, name, its table, the
/// `LoadContext`'s values).
pub(crate) const LOAD: u8 = 1;
/// Host → worker: call `process` or `on_model_switch` (the call, the context, the history).
pub(crate) const CALL: u8 = 2;
/// Host → worker, during a call: the answer to the worker's [`SUMMARIZE`] (0 and the
/// summary, or 1 and why there is none).
pub(crate) const SUMMARY: u8 = 3;
/// Host → worker, during a call: the answer to the worker's [`RECALL`] (0 and the
/// exchanges, each its score's bits and its messages; or 1 and why there are none).
pub(crate) const RECALLED: u8 = 4;
/// Worker → host: the plugin is built (name, version).
pub(crate) const LOADED: u8 = 10;
/// Worker → host: the library is refused (the reason in one line, an optional detail).
pub(crate) const REFUSED: u8 = 11;
/// Worker → host: the plugin's `new` refused its table (key, message).
pub(crate) const CONFIG_ERROR: u8 = 12;
/// Worker → host: a line the plugin logged (level, message), during `new` or a call.
pub(crate) const LOG: u8 = 13;
/// Worker → host: the call's output (history by reference to the input where it can be,
/// events).
pub(crate) const OUTPUT: u8 = 14;
/// Worker → host: the call's error (the plugin's own words, or its panic).
pub(crate) const ERROR: u8 = 15;
/// Worker → host, during a call: the plugin's `ctx.summarize()` (text, target characters,
/// purpose); the worker waits for the host's [`SUMMARY`].
pub(crate) const SUMMARIZE: u8 = 16;
/// Worker → host, during a call: the plugin's `ctx.recall()` (query, limit); the worker
/// waits for the host's [`RECALLED`]. The session is the call's, which the host knows.
pub(crate) const RECALL: u8 = 17;

/// In a call's output: an input message passed through, by its index in the input.
pub(crate) const SAME: u8 = 0;
/// In a call's output: a message the plugin made (a changed copy, a placeholder, a
/// summary), in full.
pub(crate) const MADE: u8 = 1;

/// A frame being built: `Encoder` with the header in place.
pub(crate) fn frame(kind: u8) -> Encoder {
    let mut encoder = Encoder::default();
    encoder.u32(0);
    encoder.u8(kind);
    encoder
}

/// Writes a frame built by [`frame`], filling in its length.
pub(crate) fn send(out: &mut impl Write, mut frame: Encoder) -> io::Result<()> {
    let length = u32::try_from(frame.bytes.len() - 4)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a frame past 4 GiB"))?;
    frame.bytes[..4].copy_from_slice(&length.to_le_bytes());
    out.write_all(&frame.bytes)?;
    out.flush()
}

/// Why no frame was read.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// The deadline passed first.
    Late,
    /// The other side closed its end (it ended, or closed the pipe).
    Closed,
    /// The pipe failed, or the frame is not one (how the worker ended says more).
    Broken,
}

/// Reads frames from a pipe, keeping what arrived past the last frame.
pub(crate) struct FrameReader<R> {
    pipe: R,
    buffer: Vec<u8>,
}

impl<R: Read + AsRawFd> FrameReader<R> {
    pub(crate) fn new(pipe: R) -> FrameReader<R> {
        FrameReader {
            pipe,
            buffer: Vec::new(),
        }
    }

    /// The next frame, waiting until `deadline` at most.
    pub(crate) fn read(&mut self, deadline: Option<Instant>) -> Result<Frame, ReadFailure> {
        self.fill(5, deadline)?;
        let length =
            u32::from_le_bytes([self.buffer[0], self.buffer[1], self.buffer[2], self.buffer[3]]) as usize;
        if length == 0 {
            return Err(ReadFailure::Broken);
        }
        self.fill(4 + length, deadline)?;
        // The frame keeps the buffer (no copy of the payload); what came after it stays.
        let rest = self.buffer.split_off(4 + length);
        Ok(Frame {
            bytes: std::mem::replace(&mut self.buffer, rest),
        })
    }

    /// Reads until the buffer holds `n` bytes (or more, when more has arrived).
    fn fill(&mut self, n: usize, deadline: Option<Instant>) -> Result<(), ReadFailure> {
        let mut filled = self.buffer.len();
        while filled < n {
            wait_readable(self.pipe.as_raw_fd(), deadline)?;
            self.buffer.resize(n.max(filled + 4096), 0);
            let read = self.pipe.read(&mut self.buffer[filled..]);
            match read {
                Ok(0) => {
                    self.buffer.truncate(filled);
                    return Err(ReadFailure::Closed);
                }
                Ok(read) => filled += read,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.buffer.truncate(filled);
                    return Err(ReadFailure::Broken);
                }
            }
        }
        self.buffer.truncate(filled);
        Ok(())
    }
}

/// One frame read: its kind and payload.
pub(crate) struct Frame {
    /// The whole frame, header included.
    bytes: Vec<u8>,
}

impl Frame {
    pub(crate) fn kind(&self) -> u8 {
        self.bytes[4]
    }

    pub(crate) fn payload(&self) -> &[u8] {
        &self.bytes[5..]
    }
}

/// How much a worker's pipe holds, asked for (Linux; at most `fs.pipe-max-size`, 1 MiB by
/// default): a history of a thousand messages crosses in one write instead of sixteen
/// 64 KiB rounds between the two processes.
const PIPE_BYTES: i32 = 1 << 20;

/// Asks the kernel for a larger pipe buffer; where it refuses, the pipe works as it is.
pub(crate) fn widen_pipe(pipe: &impl AsRawFd) {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain descriptor call on a pipe this process owns.
    unsafe {
        libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES);
    }
}

/// Waits until `fd` can be read (data or end of file), or `deadline` passes.
fn wait_readable(fd: i32, deadline: Option<Instant>) -> Result<(), ReadFailure> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                // Rounded up, so a wait never ends just short of the deadline.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the length given.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout_ms) };
        match ready {
            n if n > 0 => return Ok(()),
            0 if deadline.is_some_and(|d| Instant::now() >= d) => return Err(ReadFailure::Late),
            0 => {}
            _ => {
                if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    return Err(ReadFailure::Broken);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[test]
    fn frames_arrive_whole_and_in_order_and_a_silent_peer_is_late() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut first = frame(LOG);
        first.str("hello");
        send(&mut a, first).unwrap();
        let big = "x".repeat(3 << 20);
        let writer = std::thread::spawn(move || {
            let mut second = frame(OUTPUT);
            second.str(&big);
            send(&mut a, second).unwrap();
            a
        });
        let mut reader = FrameReader::new(b);
        let first = reader.read(None).unwrap();
        assert_eq!(first.kind(), LOG);
        assert_eq!(
            super::super::codec::Decoder::new(first.payload()).str().unwrap(),
            "hello"
        );
        let second = reader.read(None).unwrap();
        assert_eq!((second.kind(), second.payload().len()), (OUTPUT, 4 + (3 << 20)));
        let a = writer.join().unwrap();

        let started = Instant::now();
        let late = reader.read(Some(Instant::now() + Duration::from_millis(50)));
        assert!(matches!(late, Err(ReadFailure::Late)));
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(a);
        assert!(matches!(reader.read(None), Err(ReadFailure::Closed)));
    }
}
