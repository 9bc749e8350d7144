//! The worker's side (docs/chain.md#isolation): one plugin, loaded in this process, serving
//! the host's calls over stdin and stdout until the host closes stdin.
//!
//! The pipes are the worker's, not the plugin's: they are moved to descriptors of their
//! own at start, fd 0 then reads `/dev/null` and fd 1 points at stderr, so a plugin that
//! reads stdin, prints or closes fd 1 cannot touch the frames (as `output` keeps the
//! host's stdout). The plugin's log lines go back to the host as frames, which logs them
//! under the plugin's name; token counts are this process's own service, the same code as
//! the host's. A summary is the host's: `ctx.summarize()` sends a SUMMARIZE frame in the
//! middle of the call and waits for the host's SUMMARY, answered by the host's summarizer
//! and cache (the worker connects no `[summarizer]` of its own), within the call's
//! deadline (docs/chain.md#isolation). So is a recall: `ctx.recall()` sends a RECALL
//! frame and waits for the host's RECALLED, the exchanges of the call's session's
//! transcript.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use abi_stable::{prefix_type::WithMetadata, staticref};
use plugin_api::{
    Context, HostServices, HostServicesRef, LoadContext, LogLevel, Message, PluginBox, RArc, RResult, RSlice,
    RStr, RString, RVec, Recalled,
};
use rustc_hash::FxHashMap;

use super::codec::{Decoded, Decoder, Encoder, Malformed};
use super::framing::{self, FrameReader, ReadFailure};
use crate::library::PluginLibrary;
use crate::services;
use plugin_api::parts::{ImageTokens, MediaRules};

/// Where frames go: the real stdout, shared by the call's answer and the plugin's log
/// lines (which may come from any thread the plugin starts).
static FRAMES_OUT: Mutex<Option<File>> = Mutex::new(None);

fn send(frame: Encoder) -> io::Result<()> {
    let mut out = FRAMES_OUT.lock().unwrap_or_else(|e| e.into_inner());
    match out.as_mut() {
        Some(file) => framing::send(file, frame),
        None => Err(io::Error::new(io::ErrorKind::NotConnected, "no frame output")),
    }
}

/// The host's pipe, read by the request loop between calls and by `summarize` during one
/// (which waits for the host's answer on it). Taken by one reader at a time.
static FRAMES_IN: Mutex<Option<FrameReader<File>>> = Mutex::new(None);

/// Whether a call is running: the host answers a summary request only then.
static IN_CALL: AtomicBool = AtomicBool::new(false);

/// The plugin's `summarize`: asks the host and waits for its answer.
extern "C" fn summarize_through_host(
    text: RStr<'_>,
    target_chars: u64,
    purpose: RStr<'_>,
) -> RResult<RString, RString> {
    match ask_host(text.as_str(), target_chars, purpose.as_str()) {
        Ok(summary) => RResult::ROk(summary.into()),
        Err(reason) => RResult::RErr(reason.into()),
    }
}

fn ask_host(text: &str, target_chars: u64, purpose: &str) -> Result<String, String> {
    let mut frame = framing::frame(framing::SUMMARIZE);
    frame.str(text);
    frame.u64(target_chars);
    frame.str(purpose);
    ask("summary", frame, framing::SUMMARY, |reply| {
        let ok = reply.u8()? == 0;
        let text = reply.str()?.to_string();
        Ok(if ok { Ok(text) } else { Err(text) })
    })
}

/// The plugin's `recall`: asks the host, which searches the call's session's transcript
/// (docs/chain.md#isolation), and waits for its answer.
extern "C" fn recall_through_host(
    _: &Context,
    query: RStr<'_>,
    limit: u64,
) -> RResult<RVec<Recalled>, RString> {
    let mut frame = framing::frame(framing::RECALL);
    frame.str(query.as_str());
    frame.u64(limit);
    let answer = ask("recall", frame, framing::RECALLED, |reply| {
        if reply.u8()? != 0 {
            return Ok(Err(reply.str()?.to_string()));
        }
        let count = reply.len()?;
        let mut found = Vec::with_capacity(count);
        for _ in 0..count {
            let score = f64::from_bits(reply.u64()?);
            let messages = (0..reply.len()?)
                .map(|_| reply.message())
                .collect::<Decoded<RVec<_>>>()?;
            found.push(Recalled { score, messages });
        }
        Ok(Ok(found))
    });
    match answer {
        Ok(found) => RResult::ROk(found.into()),
        Err(reason) => RResult::RErr(reason.into()),
    }
}

/// Sends `frame`, a question to the host during a call (`what` it asks for), and decodes
/// its answer, a frame of kind `reply_kind`, with `decode`.
fn ask<T>(
    what: &str,
    frame: Encoder,
    reply_kind: u8,
    decode: impl FnOnce(&mut Decoder<'_>) -> Decoded<Result<T, String>>,
) -> Result<T, String> {
    if !IN_CALL.load(Ordering::SeqCst) {
        return Err(format!("{what} was asked for outside a call of the plugin"));
    }
    // One question at a time: the answer is the next frame on the pipe.
    let mut input = FRAMES_IN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(input) = input.as_mut() else {
        return Err("the worker has no pipe to its host".to_string());
    };
    let gone = || format!("the host did not answer the {what} request");
    send(frame).map_err(|_| gone())?;
    // No deadline here: the host kills this worker when the call's deadline passes.
    let answer = input.read(None).map_err(|_| gone())?;
    let decoded = (|| {
        if answer.kind() != reply_kind {
            return Err(Malformed(format!("an unexpected frame {}", answer.kind())));
        }
        let mut reply = Decoder::new(answer.payload());
        let result = decode(&mut reply)?;
        reply.finish()?;
        Ok(result)
    })();
    decoded.unwrap_or_else(|Malformed(why)| Err(format!("the host's answer was broken ({why})")))
}

extern "C" fn log_to_host(level: LogLevel, message: RStr<'_>) {
    let mut frame = framing::frame(framing::LOG);
    frame.u8(level as u8);
    frame.str(message.as_str());
    // The host is gone if this fails; the call's answer will fail the same way.
    let _ = send(frame);
}

struct Instance;

impl Instance {
    staticref!(const SERVICES: WithMetadata<HostServices> = WithMetadata::new(HostServices {
        count_text: services::count_text,
        count_content: services::count_content,
        log: log_to_host,
        summarize: summarize_through_host,
        recall: recall_through_host,
    }));
}

/// The worker's services: the host's, with log lines and summary requests sent to the host.
const SERVICES: HostServicesRef = HostServicesRef(Instance::SERVICES.as_prefix());

/// Moves `fd` to a new close-on-exec descriptor and points `fd` at `replacement`.
fn take_fd(fd: i32, replacement: i32) -> io::Result<File> {
    // SAFETY: plain descriptor calls; the new descriptor is owned by the File alone.
    unsafe {
        let kept = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
        if kept < 0 {
            return Err(io::Error::last_os_error());
        }
        let file = File::from_raw_fd(kept);
        if libc::dup2(replacement, fd) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(file)
    }
}

/// Ends this worker when the host that started it is gone, even while the plugin is
/// stuck in a call (no end of file on stdin would be read then).
fn watch_parent() {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let _ = std::thread::Builder::new()
        .name("worker-watch".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            // SAFETY: as above; _exit ends the process without running the plugin's code.
            unsafe {
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
            }
        });
}

/// The worker: what a binary's hidden `worker` subcommand runs (`history-host worker`,
/// docs/chain.md#isolation). Returns when the host closes the pipe (0) or breaks the
/// protocol (1).
pub fn serve() -> ExitCode {
    let _ = io::stdout().flush();
    let pipes = (|| {
        // SAFETY: opens /dev/null for the plugin's fd 0.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        let input = take_fd(libc::STDIN_FILENO, null)?;
        // SAFETY: closes the descriptor opened just above (fd 0 keeps its copy).
        unsafe { libc::close(null) };
        let output = take_fd(libc::STDOUT_FILENO, libc::STDERR_FILENO)?;
        Ok::<_, io::Error>((input, output))
    })();
    let (input, output) = match pipes {
        Ok(pipes) => pipes,
        Err(err) => {
            crate::output::error_line("worker", &format!("cannot set up its pipes: {err}"));
            return ExitCode::FAILURE;
        }
    };
    *FRAMES_OUT.lock().unwrap_or_else(|e| e.into_inner()) = Some(output);
    *FRAMES_IN.lock().unwrap_or_else(|e| e.into_inner()) = Some(FrameReader::new(input));
    watch_parent();
    let mut plugin: Option<PluginBox> = None;
    loop {
        let next = match FRAMES_IN.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(requests) => requests.read(None),
            None => Err(ReadFailure::Broken),
        };
        let frame = match next {
            Ok(frame) => frame,
            Err(ReadFailure::Closed) => return ExitCode::SUCCESS,
            Err(_) => return ExitCode::FAILURE,
        };
        let answered = match (frame.kind(), plugin.as_ref()) {
            (framing::LOAD, None) => match load(frame.payload()) {
                Ok((instance, answer)) => {
                    plugin = instance;
                    send(answer)
                }
                Err(_) => return ExitCode::FAILURE,
            },
            (framing::CALL, Some(instance)) => match call(instance, frame.payload()) {
                Ok(answer) => send(answer),
                Err(_) => return ExitCode::FAILURE,
            },
            _ => return ExitCode::FAILURE,
        };
        if answered.is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// Loads the library and builds the plugin, by the host's own loader and checks.
fn load(payload: &[u8]) -> Decoded<(Option<PluginBox>, Encoder)> {
    let mut request = Decoder::new(payload);
    let path = request.str()?.to_string();
    let expected = request.str()?.to_string();
    let config_json = request.string()?;
    let agent_max_ctx = request.u64()?;
    let models = (0..request.len()?)
        .map(|_| request.model())
        .collect::<Decoded<Vec<_>>>()?;
    request.finish()?;
    let library = match PluginLibrary::load(Path::new(&path)) {
        Ok(library) => library,
        Err(refusal) => {
            let mut answer = framing::frame(framing::REFUSED);
            answer.str(&refusal.reason);
            answer.str(refusal.detail.as_deref().unwrap_or(""));
            return Ok((None, answer));
        }
    };
    if library.name != expected {
        let mut answer = framing::frame(framing::REFUSED);
        answer.str(&format!(
            "it exports the name \"{}\", not \"{expected}\" as its file name says",
            library.name
        ));
        answer.str("");
        return Ok((None, answer));
    }
    let load = LoadContext {
        config_json,
        agent_max_ctx,
        models: models.into(),
        services: SERVICES,
    };
    Ok(match library.instantiate(&load) {
        Ok(instance) => {
            let mut answer = framing::frame(framing::LOADED);
            answer.str(&library.name);
            answer.str(&library.version);
            (Some(instance), answer)
        }
        Err(err) => {
            let mut answer = framing::frame(framing::CONFIG_ERROR);
            answer.str(&err.key);
            answer.str(&err.message);
            (None, answer)
        }
    })
}

/// One call: decodes the request, calls the plugin, encodes its answer. An output
/// message that is an input message passed through is sent as its index.
fn call(instance: &PluginBox, payload: &[u8]) -> Decoded<Encoder> {
    let mut request = Decoder::new(payload);
    let switch = match request.u8()? {
        0 => None,
        1 => Some((request.model()?, request.model()?)),
        _ => return Err(Malformed("an unknown call".into())),
    };
    let ctx = request.context(SERVICES)?;
    let rules = MediaRules {
        image_tokens: match request.u8()? {
            0 => ImageTokens::OpenaiTiles,
            1 => ImageTokens::AnthropicArea,
            _ => return Err(Malformed("an unknown image_tokens rule".into())),
        },
        image_tokens_unknown: request.u64()?,
        document_tokens_per_page: request.u64()?,
        audio_tokens_per_second: request.u64()?,
        audio_tokens_unknown: Some(request.u64()?).filter(|&tokens| tokens != u64::MAX),
    };
    let count = request.len()?;
    let mut history: Vec<RArc<Message>> = Vec::with_capacity(count);
    for _ in 0..count {
        history.push(request.message()?);
    }
    request.finish()?;
    let input = RSlice::from_slice(&history);
    IN_CALL.store(true, Ordering::SeqCst);
    let result = crate::tokens::with_media_rules(rules, || match &switch {
        None => instance.process(input, &ctx),
        Some((old, new)) => instance.on_model_switch(input, &ctx, old, new),
    });
    IN_CALL.store(false, Ordering::SeqCst);
    let output = match result {
        RResult::ROk(output) => output,
        RResult::RErr(message) => {
            let mut answer = framing::frame(framing::ERROR);
            answer.str(&message);
            return Ok(answer);
        }
    };
    let positions: FxHashMap<*const Message, usize> = history
        .iter()
        .enumerate()
        .map(|(i, m)| (&**m as *const Message, i))
        .collect();
    let mut answer = framing::frame(framing::OUTPUT);
    answer.len(output.history.len());
    for message in output.history.iter() {
        match positions.get(&(&**message as *const Message)) {
            Some(&index) => {
                answer.u8(framing::SAME);
                answer.len(index);
            }
            None => {
                answer.u8(framing::MADE);
                answer.message(message);
            }
        }
    }
    answer.len(output.events.len());
    for event in output.events.iter() {
        answer.event(event);
    }
    Ok(answer)
}
