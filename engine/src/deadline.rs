//! Plugin calls under a deadline (`[history] plugin_timeout_ms`, docs/chain.md#deadline):
//! a call runs on a pooled helper thread while the caller waits at most the deadline. A
//! call past it is left running on its thread, which is never reused; the other threads
//! of the pool serve the next calls.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

/// A plugin call, packed to run on a helper thread.
pub(crate) type Job<T> = Box<dyn FnOnce() -> T + Send>;

/// The stack of a helper thread: what the main thread gets, so a plugin that ran on the
/// caller's thread runs the same here.
const STACK_BYTES: usize = 8 << 20;

/// What a call under a deadline came to.
pub(crate) enum Timed<T> {
    Done(T),
    /// Still running past the deadline: it goes on on its own thread.
    Late,
    /// The helper thread ended without an answer (it cannot be started, or the call
    /// unwound through the host's own code).
    Lost(String),
}

struct Worker<T> {
    jobs: Sender<Job<T>>,
    answers: Receiver<T>,
}

/// Idle helper threads, reused call after call. Dropping the pool ends them.
pub(crate) struct Pool<T> {
    idle: Mutex<Vec<Worker<T>>>,
}

impl<T: Send + 'static> Pool<T> {
    pub(crate) fn new() -> Pool<T> {
        Pool {
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `job` on a helper thread and waits for it at most `limit`.
    pub(crate) fn call(&self, limit: Duration, job: Job<T>) -> Timed<T> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let worker = match idle {
            Some(worker) => worker,
            None => match spawn() {
                Ok(worker) => worker,
                Err(e) => return Timed::Lost(format!("cannot start a thread for the call: {e}")),
            },
        };
        if worker.jobs.send(job).is_err() {
            return Timed::Lost("the call's thread has ended".to_string());
        }
        match worker.answers.recv_timeout(limit) {
            Ok(answer) => {
                self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(worker);
                Timed::Done(answer)
            }
            // The worker is dropped: its thread ends when the call returns, if ever.
            Err(RecvTimeoutError::Timeout) => Timed::Late,
            Err(RecvTimeoutError::Disconnected) => {
                Timed::Lost("the call's thread ended without an answer".to_string())
            }
        }
    }
}

fn spawn<T: Send + 'static>() -> std::io::Result<Worker<T>> {
    let (jobs, job_queue) = mpsc::channel::<Job<T>>();
    let (answer, answers) = mpsc::channel();
    std::thread::Builder::new()
        .name("plugin-call".to_string())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            for job in job_queue {
                if answer.send(job()).is_err() {
                    break;
                }
            }
        })?;
    Ok(Worker { jobs, answers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_in_time_answers_and_its_thread_is_reused() {
        let pool = Pool::new();
        for n in 0..3 {
            match pool.call(Duration::from_secs(5), Box::new(move || n * 2)) {
                Timed::Done(v) => assert_eq!(v, n * 2),
                _ => panic!("the call answers"),
            }
        }
        assert_eq!(pool.idle.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_call_past_the_deadline_is_left_behind() {
        let pool = Pool::new();
        let started = std::time::Instant::now();
        let slow = pool.call(
            Duration::from_millis(50),
            Box::new(|| {
                std::thread::sleep(Duration::from_secs(2));
                1
            }),
        );
        assert!(matches!(slow, Timed::Late));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(pool.idle.lock().unwrap().is_empty(), "its thread is not reused");
        assert!(matches!(
            pool.call(Duration::from_secs(5), Box::new(|| 2)),
            Timed::Done(2)
        ));
    }
}
