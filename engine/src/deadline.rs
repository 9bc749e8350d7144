//! Plugin calls under a deadline (`[history] plugin_timeout_ms`, docs/chain.md#deadline):
//! a call runs on a pooled helper thread while the caller waits at most the deadline. A
//! call past it is left running on its thread, which is never reused; the other threads
//! of the pool serve the next calls.
//!
//! Time a call spends waiting on the host's own services (the summarizer's network call)
//! is the host's, not the plugin's: the deadline is pushed back by it
//! ([`in_host_service`]), and the summarizer bounds it per call by its own `timeout_ms`
//! (docs/chain.md#deadline).

use std::cell::RefCell;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A plugin call, packed to run on a helper thread.
pub(crate) type Job<T> = Box<dyn FnOnce() -> T + Send>;

/// The time one call has spent in host services so far: what its wait is extended by.
#[derive(Default)]
struct ServiceTime {
    /// (time spent in finished service calls, start of the one running now).
    spent: Mutex<(Duration, Option<Instant>)>,
}

impl ServiceTime {
    fn so_far(&self) -> (Duration, bool) {
        let spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        match spent.1 {
            Some(since) => (spent.0 + since.elapsed(), true),
            None => (spent.0, false),
        }
    }
}

thread_local! {
    /// The service clock of the call running on this helper thread, if any.
    static CURRENT: RefCell<Option<Arc<ServiceTime>>> = const { RefCell::new(None) };
}

/// Runs `f`, a host service a plugin called, outside the plugin's deadline: the call's
/// wait is extended by the time `f` takes. Outside a call under a deadline it just runs `f`.
pub(crate) fn in_host_service<R>(f: impl FnOnce() -> R) -> R {
    let clock = CURRENT.with(|c| c.borrow().clone());
    let Some(clock) = clock else { return f() };
    clock.spent.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(Instant::now());
    let result = f();
    let mut spent = clock.spent.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(since) = spent.1.take() {
        spent.0 += since.elapsed();
    }
    result
}

/// Runs `f`, a plugin call made on this thread rather than on a helper thread (an isolated
/// plugin's, which waits on its worker's pipe; any call when there is no deadline), with a
/// service clock of its own, so [`in_host_service`] and [`host_service_spent`] count its
/// host-service time.
pub(crate) fn with_service_clock<R>(f: impl FnOnce() -> R) -> R {
    let outer = CURRENT.with(|c| c.borrow_mut().replace(Arc::new(ServiceTime::default())));
    let result = f();
    CURRENT.with(|c| *c.borrow_mut() = outer);
    result
}

/// The time the call running on this thread has spent in host services so far; `None`
/// outside a call under a deadline.
pub(crate) fn host_service_spent() -> Option<Duration> {
    CURRENT.with(|c| c.borrow().as_ref().map(|clock| clock.so_far().0))
}

/// While a call is in a host service, how often its waiter looks again at least.
const SERVICE_RECHECK: Duration = Duration::from_millis(20);

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
    jobs: Sender<(Job<T>, Arc<ServiceTime>)>,
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

    /// Runs `job` on a helper thread and waits for it at most `limit`, plus the time it
    /// spends in host services.
    pub(crate) fn call(&self, limit: Duration, job: Job<T>) -> Timed<T> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let worker = match idle {
            Some(worker) => worker,
            None => match spawn() {
                Ok(worker) => worker,
                Err(e) => return Timed::Lost(format!("cannot start a thread for the call: {e}")),
            },
        };
        let clock = Arc::new(ServiceTime::default());
        if worker.jobs.send((job, clock.clone())).is_err() {
            return Timed::Lost("the call's thread has ended".to_string());
        }
        let started = Instant::now();
        loop {
            let (service, in_service) = clock.so_far();
            let left = (limit + service).saturating_sub(started.elapsed());
            if left.is_zero() && !in_service {
                // The worker is dropped: its thread ends when the call returns, if ever.
                return Timed::Late;
            }
            let wait = if in_service {
                left.max(SERVICE_RECHECK)
            } else {
                left
            };
            match worker.answers.recv_timeout(wait) {
                Ok(answer) => {
                    self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(worker);
                    return Timed::Done(answer);
                }
                // Look again: the call may have been in a host service meanwhile.
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Timed::Lost("the call's thread ended without an answer".to_string())
                }
            }
        }
    }
}

fn spawn<T: Send + 'static>() -> std::io::Result<Worker<T>> {
    let (jobs, job_queue) = mpsc::channel::<(Job<T>, Arc<ServiceTime>)>();
    let (answer, answers) = mpsc::channel();
    std::thread::Builder::new()
        .name("plugin-call".to_string())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            for (job, clock) in job_queue {
                CURRENT.with(|c| *c.borrow_mut() = Some(clock));
                let result = job();
                CURRENT.with(|c| *c.borrow_mut() = None);
                if answer.send(result).is_err() {
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

    #[test]
    fn time_in_a_host_service_does_not_count_against_the_deadline() {
        let pool = Pool::new();
        // 300 ms in a host service, 30 ms of its own, under a 100 ms deadline: in time.
        let answer = pool.call(
            Duration::from_millis(100),
            Box::new(|| {
                in_host_service(|| std::thread::sleep(Duration::from_millis(300)));
                std::thread::sleep(Duration::from_millis(30));
                host_service_spent()
            }),
        );
        match answer {
            Timed::Done(Some(spent)) => assert!(spent >= Duration::from_millis(300), "{spent:?}"),
            _ => panic!("the call answers, with its service time"),
        }
        // Its own time still counts: 150 ms of its own after a service call is late.
        let late = pool.call(
            Duration::from_millis(100),
            Box::new(|| {
                in_host_service(|| std::thread::sleep(Duration::from_millis(50)));
                std::thread::sleep(Duration::from_millis(400));
                None
            }),
        );
        assert!(matches!(late, Timed::Late));
        assert_eq!(host_service_spent(), None, "no clock outside a call");
    }
}
