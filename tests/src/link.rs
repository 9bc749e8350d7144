//! A TCP forwarder on loopback that a test can cut and restore: from the client's side,
//! what a database restart or a network outage looks like. Cutting it shuts down every
//! forwarded connection (a query in flight fails as when the server's backends are
//! terminated) and refuses new ones until it is restored.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A forwarder from a free 127.0.0.1 port to `target`. Stops when dropped.
pub struct Link {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    up: AtomicBool,
    stopped: AtomicBool,
    /// Both ends of every forwarded connection, to shut down on a cut.
    open: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn shut_all(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Link {
    /// Forwards to `target` (`host:port`).
    pub fn to(target: &str) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            up: AtomicBool::new(true),
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
                if !accepting.up.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
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
                pump(client.try_clone().unwrap(), server.try_clone().unwrap());
                pump(server, client);
            }
        });
        Link { addr, shared }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Shuts down every forwarded connection and refuses new ones.
    pub fn cut(&self) {
        self.shared.up.store(false, Ordering::SeqCst);
        self.shared.shut_all();
    }

    /// Accepts and forwards connections again.
    pub fn restore(&self) {
        self.shared.up.store(true, Ordering::SeqCst);
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

/// Copies `from` into `to` on a thread of its own until either end closes.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
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
