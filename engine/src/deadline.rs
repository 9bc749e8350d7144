//! Plugin calls under a deadline (`[history] plugin_timeout_ms`, docs/chain.md#deadline):
//! a run of calls (a chain's stages) goes to a pooled helper thread while the caller
//! waits, looking at the call in progress, at most the deadline per call. A call past it
//! is left running on its thread, which is never reused, and the caller goes on from the
//! checkpoint the run left before that call; the other threads of the pool serve the
//! next runs.
//!
//! Time a call spends waiting on the host's own services (the summarizer's network call)
//! is the host's, not the plugin's: the deadline is pushed back by it
//! ([`in_host_service`]), and the summarizer bounds it per call by its own `timeout_ms`
//! (docs/chain.md#deadline).

use std::cell::RefCell;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    with_clock(Arc::new(ServiceTime::default()), f)
}

/// Runs `f` with `clock` as this thread's service clock, the outer one put back after.
fn with_clock<R>(clock: Arc<ServiceTime>, f: impl FnOnce() -> R) -> R {
    let outer = CURRENT.with(|c| c.borrow_mut().replace(clock));
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

/// A job for a helper thread: a run of plugin calls and the host's work between them.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// What a job on a helper thread shares with the thread waiting for it: the plugin call it
/// is in, if any (`C`: what the waiter goes on from should that call run late), and its
/// answer (`T`).
pub(crate) struct Watch<C, T> {
    shared: Mutex<Shared<C, T>>,
}

struct Shared<C, T> {
    call: Option<InCall<C>>,
    /// The waiter gave up on the call in progress: the job must end as soon as it returns.
    abandoned: bool,
    answer: Option<T>,
}

struct InCall<C> {
    /// Which call of the job (the waiter's numbering: a stage's index).
    index: usize,
    started: Instant,
    clock: Arc<ServiceTime>,
    checkpoint: C,
}

impl<C, T> Watch<C, T> {
    fn new() -> Watch<C, T> {
        Watch {
            shared: Mutex::new(Shared {
                call: None,
                abandoned: false,
                answer: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared<C, T>> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// On the helper thread: runs `f`, plugin call `index`, under the deadline, with
    /// `checkpoint` in the waiter's hands meanwhile (what it goes on from if the call runs
    /// late). Gives back `f`'s answer and the checkpoint, or `None` when the waiter gave
    /// up on the call: the job must then end at once, touching nothing of the run.
    pub(crate) fn call<R>(&self, index: usize, checkpoint: C, f: impl FnOnce() -> R) -> Option<(R, C)> {
        let clock = Arc::new(ServiceTime::default());
        self.lock().call = Some(InCall {
            index,
            started: Instant::now(),
            clock: clock.clone(),
            checkpoint,
        });
        let answer = with_clock(clock, f);
        let mut shared = self.lock();
        if shared.abandoned {
            return None;
        }
        let call = shared.call.take()?;
        Some((answer, call.checkpoint))
    }

    /// How long the waiter may sleep before it looks again, or the call that is late.
    fn look(&self, limit: Duration) -> Result<Duration, InCall<C>> {
        let mut shared = self.lock();
        let Some(call) = &shared.call else {
            // Between calls the host's own code runs: no deadline; look again later.
            return Ok(limit);
        };
        let (service, in_service) = call.clock.so_far();
        let left = (limit + service).saturating_sub(call.started.elapsed());
        if in_service {
            return Ok(left.max(SERVICE_RECHECK));
        }
        if !left.is_zero() {
            return Ok(left);
        }
        shared.abandoned = true;
        Err(shared.call.take().expect("a call is in progress"))
    }
}

/// What a job under a deadline came to.
pub(crate) enum Watched<C, T> {
    Done(T),
    /// Call `index` ran past the deadline: it goes on on its own thread, and the job with
    /// it ends when it returns, if ever. `checkpoint` is what the job left for this.
    Late {
        index: usize,
        elapsed: Duration,
        checkpoint: C,
    },
    /// The helper thread ended without an answer (it cannot be started, or the job
    /// unwound through the host's own code).
    Lost(String),
}

struct Worker {
    jobs: Sender<Job>,
    done: Receiver<()>,
}

/// Idle helper threads, reused job after job. Dropping the pool ends them.
pub(crate) struct Pool {
    idle: Mutex<Vec<Worker>>,
}

impl Pool {
    pub(crate) fn new() -> Pool {
        Pool {
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `job` on a helper thread while this one waits, so that each plugin call the job
    /// makes through [`Watch::call`] is waited for at most `limit`, plus the time it spends
    /// in host services. One hand-over per job, however many calls it makes: handing each
    /// call to a thread of its own cost a turn about a fifth of its CPU
    /// (docs/chain.md#deadline).
    pub(crate) fn run<C, T>(
        &self,
        limit: Duration,
        job: impl FnOnce(&Watch<C, T>) -> T + Send + 'static,
    ) -> Watched<C, T>
    where
        C: Send + 'static,
        T: Send + 'static,
    {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let worker = match idle {
            Some(worker) => worker,
            None => match spawn() {
                Ok(worker) => worker,
                Err(e) => return Watched::Lost(format!("cannot start a thread for the run: {e}")),
            },
        };
        let watch = Arc::new(Watch::new());
        let theirs = watch.clone();
        let job: Job = Box::new(move || {
            let answer = job(&theirs);
            theirs.lock().answer = Some(answer);
        });
        if worker.jobs.send(job).is_err() {
            return Watched::Lost("the run's thread has ended".to_string());
        }
        loop {
            let wait = match watch.look(limit) {
                Ok(wait) => wait,
                // The worker is dropped: its thread ends when the late call returns.
                Err(call) => {
                    return Watched::Late {
                        index: call.index,
                        elapsed: call.started.elapsed(),
                        checkpoint: call.checkpoint,
                    }
                }
            };
            match spin_then_wait(&worker.done, SPIN, wait) {
                Ok(()) => {
                    let answer = watch.lock().answer.take();
                    self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(worker);
                    return match answer {
                        Some(answer) => Watched::Done(answer),
                        None => Watched::Lost("the run's thread gave no answer".to_string()),
                    };
                }
                // Look again: a call may have started, or be in a host service.
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Watched::Lost("the run's thread ended without an answer".to_string())
                }
            }
        }
    }
}

/// How long the caller waiting for a run looks again and again before it sleeps: a
/// sleeping core of this virtual machine took about 25 µs to wake each way, against a
/// run of the shipped chain's 70–100 µs on a session's turn (docs/chain.md#deadline).
/// Each look yields the core to any other thread that wants it, so under load the wait
/// takes little from others.
const SPIN: Duration = Duration::from_micros(150);

/// How long a helper looks for its next run before it sleeps: a session's next turn, or a
/// turn's main pass after its ingest pass, comes within that when the machine is idle.
const NEXT_JOB_SPIN: Duration = Duration::from_micros(50);

/// `receiver.recv_timeout(wait)` (`Duration::MAX`: no time-out), looking again and again
/// for `spin` first, yielding the core each time.
fn spin_then_wait<T>(receiver: &Receiver<T>, spin: Duration, wait: Duration) -> Result<T, RecvTimeoutError> {
    let started = Instant::now();
    let spin = spin.min(wait);
    loop {
        match receiver.try_recv() {
            Ok(value) => return Ok(value),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) if started.elapsed() < spin => std::thread::yield_now(),
            Err(TryRecvError::Empty) => break,
        }
    }
    if wait == Duration::MAX {
        return receiver.recv().map_err(|_| RecvTimeoutError::Disconnected);
    }
    receiver.recv_timeout(wait.saturating_sub(started.elapsed()))
}

fn spawn() -> std::io::Result<Worker> {
    let (jobs, job_queue) = mpsc::channel::<Job>();
    let (done, dones) = mpsc::channel();
    std::thread::Builder::new()
        .name("plugin-calls".to_string())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            while let Ok(job) = spin_then_wait(&job_queue, NEXT_JOB_SPIN, Duration::MAX) {
                job();
                if done.send(()).is_err() {
                    break;
                }
            }
        })?;
    Ok(Worker { jobs, done: dones })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `calls`, each sleeping its milliseconds (the first `in_service` of them
    /// in a host service), its checkpoint the number of calls done so far.
    fn run(pool: &Pool, limit_ms: u64, calls: Vec<(u64, u64)>) -> Watched<usize, usize> {
        pool.run(
            Duration::from_millis(limit_ms),
            move |watch: &Watch<usize, usize>| {
                let mut done = 0;
                for (index, (own, in_service)) in calls.into_iter().enumerate() {
                    let call = watch.call(index, done, || {
                        in_host_service(|| std::thread::sleep(Duration::from_millis(in_service)));
                        std::thread::sleep(Duration::from_millis(own));
                    });
                    match call {
                        Some(((), checkpoint)) => done = checkpoint + 1,
                        None => return usize::MAX,
                    }
                }
                done
            },
        )
    }

    #[test]
    fn a_run_in_time_answers_and_its_thread_is_reused() {
        let pool = Pool::new();
        for _ in 0..3 {
            match run(&pool, 5_000, vec![(1, 0), (1, 0), (1, 0)]) {
                Watched::Done(done) => assert_eq!(done, 3),
                _ => panic!("the run answers"),
            }
        }
        assert_eq!(pool.idle.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_call_past_the_deadline_is_left_behind_with_the_checkpoint_before_it() {
        let pool = Pool::new();
        let started = Instant::now();
        // The first two calls are in time; the third runs two seconds under 100 ms.
        match run(&pool, 100, vec![(5, 0), (5, 0), (2_000, 0), (5, 0)]) {
            Watched::Late {
                index,
                elapsed,
                checkpoint,
            } => {
                assert_eq!(
                    (index, checkpoint),
                    (2, 2),
                    "the late call and what was done before it"
                );
                assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
            }
            _ => panic!("the third call is late"),
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(pool.idle.lock().unwrap().is_empty(), "its thread is not reused");
        assert!(matches!(run(&pool, 5_000, vec![(1, 0)]), Watched::Done(1)));
    }

    #[test]
    fn a_long_run_of_calls_each_in_time_is_not_late() {
        // Ten calls of 30 ms under a 100 ms deadline: 300 ms in all, each call in time.
        let pool = Pool::new();
        assert!(matches!(run(&pool, 100, vec![(30, 0); 10]), Watched::Done(10)));
    }

    #[test]
    fn time_in_a_host_service_does_not_count_against_the_deadline() {
        let pool = Pool::new();
        // 300 ms in a host service, 30 ms of its own, under a 100 ms deadline: in time.
        assert!(matches!(run(&pool, 100, vec![(30, 300)]), Watched::Done(1)));
        // Its own time still counts: 400 ms of its own after a service call is late.
        assert!(matches!(
            run(&pool, 100, vec![(400, 50)]),
            Watched::Late { index: 0, .. }
        ));
        assert_eq!(host_service_spent(), None, "no clock outside a call");
    }

    #[test]
    fn a_call_sees_its_service_time() {
        let pool = Pool::new();
        let answer = pool.run(
            Duration::from_millis(100),
            |watch: &Watch<(), Option<Duration>>| {
                watch
                    .call(0, (), || {
                        in_host_service(|| std::thread::sleep(Duration::from_millis(150)));
                        host_service_spent()
                    })
                    .and_then(|(spent, ())| spent)
            },
        );
        match answer {
            Watched::Done(Some(spent)) => assert!(spent >= Duration::from_millis(150), "{spent:?}"),
            _ => panic!("the call answers, with its service time"),
        }
    }
}
