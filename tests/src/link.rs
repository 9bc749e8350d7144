//! A TCP relay on loopback that a test can switch between forwarding, refusing and
//! black-holing: from the client's side, what a database restart, a refused connection
//! and a network partition (packets go nowhere) look like.
//!
//! - [`Link::cut`] (refuse): every forwarded connection is shut down (a query in flight
//!   fails as when the server's backends are terminated), and new connections are shut at
//!   once, until [`Link::restore`].
//! - [`Link::black_hole`]: every connection, open or new, is kept open and its bytes are
//!   read and dropped in both directions: nothing is refused and nothing answers.
//! - [`Link::restore`]: new connections are forwarded again; the connections that were
//!   black-holed lost bytes, so they are shut (as TCP gives up on a long partition).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const UP: u8 = 0;
const REFUSING: u8 = 1;
const BLACK_HOLE: u8 = 2;

/// A relay from a free 127.0.0.1 port to `target`. Stops when dropped.
pub struct Link {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    mode: AtomicU8,
    stopped: AtomicBool,
    /// Both ends of every connection, to shut down on a cut.
    open: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn shut_all(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn mode(&self) -> u8 {
        self.mode.load(Ordering::SeqCst)
    }
}

impl Link {
    /// Forwards to `target` (`host:port`).
    pub fn to(target: &str) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(UP),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let target = target.to_string();
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || {
            for incoming in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = incoming else { continue };
                match accepting.mode() {
                    REFUSING => {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    BLACK_HOLE => {
                        accepting.open.lock().unwrap().push(client.try_clone().unwrap());
                        swallow(client);
                        continue;
                    }
                    _ => {}
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut open = accepting.open.lock().unwrap();
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    accepting.clone(),
                );
                pump(server, client, accepting.clone());
            }
        });
        Link { addr, shared }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Refuses: shuts down every forwarded connection and every new one.
    pub fn cut(&self) {
        self.shared.mode.store(REFUSING, Ordering::SeqCst);
        self.shared.shut_all();
    }

    /// Answers nothing: every byte, on open connections and new ones, is read and dropped.
    pub fn black_hole(&self) {
        self.shared.mode.store(BLACK_HOLE, Ordering::SeqCst);
    }

    /// Forwards new connections again; connections black-holed meanwhile are shut.
    pub fn restore(&self) {
        if self.shared.mode.swap(UP, Ordering::SeqCst) == BLACK_HOLE {
            self.shared.shut_all();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.shut_all();
        // Wakes the accepting thread so it sees `stopped`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` into `to` on a thread of its own until either end closes; while the
/// link is a black hole, what it reads is dropped.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) if shared.mode() == BLACK_HOLE => {}
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// Reads and drops what `stream` sends until it closes or is shut.
fn swallow(mut stream: TcpStream) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
    });
}
