//! The real server over TCP, with hand-written HTTP/1.1.

use crate::support::*;
use ailab_sandbox_http::{ConnLimits, ServeError, ServeOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use tokio::sync::oneshot;

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Server {
    async fn start(app: axum::Router) -> Self {
        Self::start_with(app, ConnLimits::default()).await
    }

    async fn start_with(app: axum::Router, limits: ConnLimits) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(ailab_sandbox_http::serve_with(
            listener,
            app,
            limits,
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            addr,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(20), self.task).await;
        r.expect("server stops")
            .expect("server task")
            .expect("server result");
    }
}

/// Reads one response from a keep-alive connection (body by Content-Length).
fn read_one(r: &mut BufReader<TcpStream>) -> (u16, String) {
    let (status, _, body) = read_answer(r);
    (status, body)
}

/// One answer: status, headers (names lowercased) and body.
fn read_answer(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>, String) {
    let mut status_line = String::new();
    r.read_line(&mut status_line).unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut len = 0usize;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.to_ascii_lowercase(), v.trim().to_owned());
            if k == "content-length" {
                len = v.parse().unwrap();
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, headers, String::from_utf8(body).unwrap())
}

/// The server answers a fresh connection.
fn assert_still_answers(addr: SocketAddr) {
    let (status, _, body) = raw_http(addr, &get_req(addr, "/healthz", ""));
    assert_eq!(status, 200, "{body}");
}

fn get_req(addr: SocketAddr, path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_tcp_with_token_auth() {
    let e = env_with(Opts {
        write: true,
        token: Some(TOKEN),
        ..Opts::default()
    });
    let server = Server::start(e.app.clone()).await;
    let addr = server.addr;
    let root = e.root.clone();
    tokio::task::spawn_blocking(move || {
        let (status, head, body) = raw_http(addr, &get_req(addr, "/agentic/state", ""));
        assert_eq!(status, 401, "{head}\n{body}");
        assert!(head.to_ascii_lowercase().contains("www-authenticate: bearer"), "{head}");
        assert!(!head.to_ascii_lowercase().contains("access-control-"), "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["reason_code"], "unauthorized");

        let (status, _, body) = raw_http(addr, &get_req(addr, "/agentic/state", "Authorization: Bearer wrong-token-0123456789\r\n"));
        assert_eq!(status, 401, "{body}");

        let auth = format!("Authorization: Bearer {TOKEN}\r\n");
        let (status, head, body) = raw_http(addr, &get_req(addr, "/agentic/state", &auth));
        assert_eq!(status, 200, "{head}\n{body}");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["execution_mode"], "sandbox_write");

        let (status, _, body) = raw_http(addr, &get_req(addr, "/healthz", ""));
        assert_eq!(status, 401, "{body}");
        let (status, _, body) = raw_http(addr, &get_req(addr, "/healthz", &auth));
        assert_eq!(status, 200);
        assert_eq!(body, r#"{"status":"ok"}"#);

        let plan = serde_json::to_string(&create_plan("wf_tcp", "tcp/hello.md", "over TCP\n")).unwrap();
        let req = format!(
            "POST /agentic/plans HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{plan}",
            plan.len()
        );
        let (status, _, body) = raw_http(addr, &req);
        assert_eq!(status, 200, "{body}");
        assert_eq!(std::fs::read_to_string(root.join("tcp/hello.md")).unwrap(), "over TCP\n");

        let (status, head, body) = raw_http(addr, &get_req(addr, "/metrics", &auth));
        assert_eq!(status, 200);
        assert!(head.contains("text/plain; version=0.0.4; charset=utf-8"), "{head}");
        assert!(body.contains("ailab_sandbox_mutations_total"), "{body}");
    })
    .await
    .unwrap();
    server.stop().await;
}

/// Without a token, what names the host must name loopback: a request with no `Host`
/// (RFC 9112 §3.2: 400) and an absolute-form target naming another host (which RFC 9112
/// §3.2.2 puts before the header) would otherwise slip past the DNS-rebinding guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_of_the_host_is_checked() {
    let e = simulating();
    let server = Server::start(e.app.clone()).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        let answer = |req: &str| {
            let (status, head, body) = raw_http(addr, req);
            let code = serde_json::from_str::<serde_json::Value>(&body)
                .map(|v| v["reason_code"].as_str().unwrap_or_default().to_owned())
                .unwrap_or_default();
            (status, code, format!("{head}\n{body}"))
        };
        for version in ["HTTP/1.1", "HTTP/1.0"] {
            let (status, code, all) =
                answer(&format!("GET /agentic/state {version}\r\nConnection: close\r\n\r\n"));
            assert_eq!((status, code.as_str()), (400, "invalid_request"), "{all}");
        }
        let (status, code, all) = answer(
            "GET http://evil.example/agentic/state HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        );
        assert_eq!((status, code.as_str()), (403, "forbidden_host"), "{all}");
        let (status, _, all) = answer(&format!(
            "GET http://{addr}/agentic/state HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        ));
        assert_eq!(status, 200, "{all}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_serves_many_requests_on_one_connection() {
    let e = simulating();
    let server = Server::start(e.app.clone()).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        for i in 0..20 {
            let path = if i % 2 == 0 {
                "/agentic/artifacts?limit=50"
            } else {
                "/agentic/state"
            };
            write!(w, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
            let (status, body) = read_one(&mut r);
            assert_eq!(status, 200, "{body}");
        }
        // An error keeps the connection usable.
        write!(
            w,
            "GET /agentic/artifacts?limit=0 HTTP/1.1\r\nHost: {addr}\r\n\r\n"
        )
        .unwrap();
        let (status, body) = read_one(&mut r);
        assert_eq!(status, 400, "{body}");
        write!(w, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        assert_eq!(read_one(&mut r).0, 200);
    })
    .await
    .unwrap();
    server.stop().await;
}

/// A caller refused for who it is (no token, a web page, no loopback name) loses its
/// connection with the answer: it held it, and its place among the server's
/// connections, by sending a request every so often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_refused_for_who_it_is_loses_its_connection() {
    let with_token = env_with(Opts {
        token: Some(TOKEN),
        ..Opts::default()
    });
    let without = simulating();
    let servers = [
        Server::start(with_token.app.clone()).await,
        Server::start(without.app.clone()).await,
    ];
    let addrs = [servers[0].addr, servers[1].addr];
    tokio::task::spawn_blocking(move || {
        let auth = format!("Authorization: Bearer {TOKEN}\r\n");
        for (addr, extra, status) in [
            (addrs[0], String::new(), 401),
            (
                addrs[0],
                format!("{auth}Origin: http://evil.example\r\n"),
                403,
            ),
            (addrs[1], "Origin: null\r\n".to_owned(), 403),
        ] {
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            write!(w, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n{extra}\r\n").unwrap();
            let (got, head, body) = read_answer(&mut r);
            assert_eq!(got, status, "{body}");
            assert!(
                head.iter().any(|(k, v)| k == "connection" && v == "close"),
                "{head:?}"
            );
            let mut rest = Vec::new();
            assert_eq!(
                r.read_to_end(&mut rest).unwrap(),
                0,
                "the connection is closed"
            );
        }
        // Served callers keep theirs.
        let s = TcpStream::connect(addrs[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        for _ in 0..2 {
            write!(
                w,
                "GET /healthz HTTP/1.1\r\nHost: {}\r\n{auth}\r\n",
                addrs[0]
            )
            .unwrap();
            assert_eq!(read_one(&mut r).0, 200);
        }
    })
    .await
    .unwrap();
    for s in servers {
        s.stop().await;
    }
}

/// A client that shuts its sending side after a whole request is answered, and its plan
/// runs: it was dropped without a word and the plan never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_is_answered() {
    let (e, server) = small_bodies().await;
    let addr = server.addr;
    let root = e.root.clone();
    tokio::task::spawn_blocking(move || {
        let ask = |request: String| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            read_answer(&mut BufReader::new(s))
        };
        let (status, _, body) = ask(get_req(addr, "/healthz", ""));
        assert_eq!(status, 200, "{body}");
        let plan = r#"{"actions":[{"intent":"create_file","path":"hc.md","content":"sent"}]}"#;
        let (status, _, body) = ask(plan_post(addr, plan.len(), plan));
        assert_eq!(status, 200, "{body}");
        assert_eq!(std::fs::read(root.join("hc.md")).unwrap(), b"sent");
    })
    .await
    .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_wire_does_not_hurt_the_server() {
    let e = simulating();
    let server = Server::start(e.app.clone()).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        for junk in [
            &b"GARBAGE\r\n\r\n"[..],
            b"\x00\x01\x02\xff\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"POST /agentic/plans HTTP/1.1\r\nContent-Length: -4\r\n\r\n",
        ] {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(junk).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            if !out.is_empty() {
                let (status, _, _) = parse_response(&out);
                assert!(
                    (400..500).contains(&status),
                    "{}",
                    String::from_utf8_lossy(&out)
                );
            }
        }
        assert_still_answers(addr);
    })
    .await
    .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_in_flight_request_finish() {
    let e = writable();
    let mut server = Server::start(e.app.clone()).await;
    let addr = server.addr;
    let plan = serde_json::to_string(&create_plan("wf_grace", "grace.txt", "finished")).unwrap();
    let (head, tail) = plan.split_at(plan.len() / 2);
    let head = format!(
        "POST /agentic/plans HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{head}",
        plan.len()
    );
    let tail = tail.to_owned();
    // Send the headers and half the body.
    let mut stream = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        s
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Ask the server to stop while the request is in flight.
    let _ = server.stop.take().unwrap().send(());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !server.task.is_finished(),
        "the server waits for the in-flight request"
    );
    // New connections are no longer accepted.
    let refused = tokio::task::spawn_blocking(move || TcpStream::connect(addr).is_err())
        .await
        .unwrap();
    assert!(refused, "the listener is closed after the signal");
    // Finish the request: it is answered and its effect is on disk.
    let (status, body) = tokio::task::spawn_blocking(move || {
        stream.write_all(tail.as_bytes()).unwrap();
        let mut out = Vec::new();
        stream.read_to_end(&mut out).unwrap();
        let (status, _, body) = parse_response(&out);
        (status, body)
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        std::fs::read_to_string(e.root.join("grace.txt")).unwrap(),
        "finished"
    );
    server.stop().await;
}

/// Whether the server closes `s` (end of file, or a reset) within `within`, having sent
/// nothing on it.
fn closed_silently(mut s: TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!(
            "unexpected answer: {:?}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed() {
    let e = env_with(Opts::default());
    let limits = ConnLimits {
        header_read_timeout: Duration::from_secs(1),
        ..ConnLimits::default()
    };
    let server = Server::start_with(e.app.clone(), limits).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        // Nothing sent at all.
        let silent = TcpStream::connect(addr).unwrap();
        assert!(closed_silently(silent, Duration::from_secs(15)));
        // Half a request head.
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        assert!(closed_silently(half, Duration::from_secs(15)));
        // Kept alive after an answer, then idle.
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut w = s.try_clone().unwrap();
        w.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .unwrap();
        let mut r = BufReader::new(s);
        assert_eq!(read_one(&mut r).0, 200);
        assert!(closed_silently(r.into_inner(), Duration::from_secs(15)));
        assert_still_answers(addr);
    })
    .await
    .unwrap();
    server.stop().await;
}

/// A client that sends requests and never reads the answers loses its connection once
/// the answers stop moving, so it cannot hold the server's connection slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_no_answer_loses_its_connection() {
    let e = env_with(Opts::default());
    let limits = ConnLimits {
        max_connections: 1,
        write_stall_timeout: Duration::from_secs(1),
        ..ConnLimits::default()
    };
    let server = Server::start_with(e.app.clone(), limits).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        let hog = TcpStream::connect(addr).unwrap();
        hog.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
        let req = format!("GET /agentic/state HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        // Pipelined until the server stops taking requests (its answers fill the
        // buffers) or drops the connection; not one answer is read.
        let mut sent = 0;
        while sent < 200_000 && (&hog).write_all(req.as_bytes()).is_ok() {
            sent += 1;
        }
        assert!(sent > 10, "{sent}");
        // The only slot is free again: a new client is answered.
        let (status, _, body) = raw_http(addr, &get_req(addr, "/healthz", ""));
        assert_eq!(status, 200, "{body}");
        drop(hog);
    })
    .await
    .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_wait_for_room() {
    let e = env_with(Opts::default());
    let limits = ConnLimits {
        max_connections: 2,
        ..ConnLimits::default()
    };
    let server = Server::start_with(e.app.clone(), limits).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // The kernel completes the handshake; the server takes the connection only when
        // one of the two closes.
        let mut third = TcpStream::connect(addr).unwrap();
        third
            .write_all(get_req(addr, "/healthz", "").as_bytes())
            .unwrap();
        third
            .set_read_timeout(Some(Duration::from_millis(700)))
            .unwrap();
        let mut buf = [0u8; 64];
        let early = third.read(&mut buf);
        assert!(
            matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
            "answered while two connections held the room: {early:?}"
        );
        drop(held);
        third.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut out = Vec::new();
        third.read_to_end(&mut out).unwrap();
        let (status, _, body) = parse_response(&out);
        assert_eq!(status, 200, "{body}");
    })
    .await
    .unwrap();
    server.stop().await;
}

#[test]
fn run_refuses_a_public_address_without_a_token() {
    let tmp = tempfile::tempdir().unwrap();
    let sandbox =
        std::sync::Arc::new(ailab_sandbox_core::Sandbox::open(config(&tmp, false)).unwrap());
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let opts = ServeOptions {
            addr: addr.to_owned(),
            token: None,
            ..ServeOptions::default()
        };
        let err = ailab_sandbox_http::run(sandbox.clone(), opts).unwrap_err();
        assert!(
            matches!(err, ServeError::PublicWithoutToken { .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("loopback") && msg.contains("token"), "{msg}");
    }
    // An empty token is no token.
    let opts = ServeOptions {
        addr: "0.0.0.0:0".to_owned(),
        token: Some(String::new()),
        ..ServeOptions::default()
    };
    assert!(matches!(
        ailab_sandbox_http::run(sandbox.clone(), opts),
        Err(ServeError::EmptyToken)
    ));
    // Garbage addresses and a zero body limit are refused up front.
    let opts = ServeOptions {
        addr: "not an address".to_owned(),
        ..ServeOptions::default()
    };
    assert!(matches!(
        ailab_sandbox_http::run(sandbox.clone(), opts),
        Err(ServeError::InvalidAddr { .. })
    ));
    // The body limit a library caller gives is held to the config's range, as the
    // command line's is.
    for limit in [0, 1023, 256 * 1024 * 1024 + 1] {
        let opts = ServeOptions {
            addr: "127.0.0.1:0".to_owned(),
            body_limit_bytes: limit,
            ..ServeOptions::default()
        };
        let refused = ailab_sandbox_http::run(sandbox.clone(), opts);
        assert!(
            matches!(&refused, Err(e @ ServeError::BodyLimitOutOfRange(l)) if *l == limit && e.reason_code() == "invalid_config"),
            "{limit}: {refused:?}"
        );
    }
}

#[test]
fn exposure_rules() {
    use ailab_sandbox_http::{check_exposure, resolve_addr};
    let loopback = resolve_addr("127.0.0.1:8787").unwrap();
    assert!(check_exposure("127.0.0.1:8787", &loopback, None).is_ok());
    let local = resolve_addr("localhost:8787").unwrap();
    assert!(local.iter().all(|a| a.ip().is_loopback()));
    assert!(check_exposure("localhost:8787", &local, None).is_ok());
    let v6 = resolve_addr("[::1]:8787").unwrap();
    assert!(check_exposure("[::1]:8787", &v6, None).is_ok());
    let public = resolve_addr("0.0.0.0:8787").unwrap();
    assert!(check_exposure("0.0.0.0:8787", &public, None).is_err());
    assert!(check_exposure("0.0.0.0:8787", &public, Some(TOKEN)).is_ok());
    for short in ["", "short", "fifteen-chars!!"] {
        assert!(check_exposure("127.0.0.1:8787", &loopback, Some(short)).is_err());
    }
    // One no request could carry: HTTP trims header values, and refuses control bytes.
    for unsendable in [
        " 0123456789abcdef",
        "0123456789abcdef ",
        "0123456789abcdef\t",
        "0123456789\nabcdef",
    ] {
        assert!(
            matches!(
                check_exposure("127.0.0.1:8787", &loopback, Some(unsendable)),
                Err(ailab_sandbox_http::ServeError::UnsendableToken)
            ),
            "{unsendable:?}"
        );
    }
    let lan = resolve_addr("192.168.1.10:8787").unwrap();
    assert!(check_exposure("192.168.1.10:8787", &lan, None).is_err());
    assert!(resolve_addr("127.0.0.1").is_err(), "a port is needed");
}

#[test]
fn run_reports_a_busy_port() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let sandbox =
        std::sync::Arc::new(ailab_sandbox_core::Sandbox::open(config(&tmp, false)).unwrap());
    let opts = ServeOptions {
        addr: addr.to_string(),
        ..ServeOptions::default()
    };
    let err = ailab_sandbox_http::run(sandbox, opts).unwrap_err();
    assert!(matches!(err, ServeError::Bind { .. }), "{err}");
    drop(taken);
}

/// A `POST /agentic/plans` declaring a body of `len` bytes and sending `body`.
fn plan_post(addr: std::net::SocketAddr, len: usize, body: &str) -> String {
    format!(
        "POST /agentic/plans HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}"
    )
}

/// A writing server whose body limit is 4 KiB, with its environment.
async fn small_bodies() -> (Env, Server) {
    let e = env_with(Opts {
        write: true,
        body_limit: 4096,
        ..Opts::default()
    });
    let server = Server::start(e.app.clone()).await;
    (e, server)
}

/// Room for request bodies is charged as bodies arrive: clients that declare bodies and
/// send nothing, or only their first byte, hold next to none, while bodies under way, up
/// to the room for [`ailab_sandbox_http::BODIES_IN_FLIGHT`] of the largest, make a
/// further body wait, and one that already holds room answered `server_busy` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_in_flight_are_bounded() {
    let (e, server) = small_bodies().await;
    let (addr, root) = (server.addr, e.root.clone());
    tokio::task::spawn_blocking(move || {
        let post = |len: usize, body: &str| plan_post(addr, len, body);
        let stall = |n: usize, sent: &str| -> Vec<TcpStream> {
            (0..n)
                .map(|_| {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.write_all(post(4096, sent).as_bytes()).unwrap();
                    s
                })
                .collect()
        };
        let plan = |name: &str| {
            format!(r#"{{"actions":[{{"intent":"create_file","path":"{name}","content":"x"}}]}}"#)
        };
        let send = |body: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(post(body.len(), body).as_bytes()).unwrap();
            s
        };
        let answered_at_once = |name: &str| {
            let s = send(&plan(name));
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (status, body) = read_one(&mut BufReader::new(s));
            assert_eq!(status, 200, "{name}: {body}");
        };

        // Declared, not sent, or only a first byte sent: next to no room is held, a plan
        // goes through at once.
        let idle = stall(ailab_sandbox_http::BODIES_IN_FLIGHT, "");
        std::thread::sleep(Duration::from_millis(300));
        answered_at_once("a.md");
        drop(idle);
        let trickle = stall(ailab_sandbox_http::BODIES_IN_FLIGHT, " ");
        std::thread::sleep(Duration::from_millis(300));
        answered_at_once("c.md");

        drop(trickle);

        // A body that holds room and finds no more is answered at once, not held. The
        // room is 4 × 4 KiB: 2 KiB for this body, 3 × 4 KiB + 2 KiB for the others.
        let mut filling = TcpStream::connect(addr).unwrap();
        filling.write_all(post(4096, &" ".repeat(2048)).as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut full = stall(3, &" ".repeat(4095));
        full.extend(stall(1, &" ".repeat(2048)));
        std::thread::sleep(Duration::from_millis(300));
        filling.write_all(" ".repeat(2048).as_bytes()).unwrap();
        filling.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (status, headers, body) = read_answer(&mut BufReader::new(filling));
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("\"server_busy\""), "{body}");
        assert!(
            headers.iter().any(|(k, v)| k == "retry-after" && v == "1"),
            "{headers:?}"
        );

        // Holding nothing, the next body waits for room (the room is full again).
        full.extend(stall(1, &" ".repeat(2048)));
        std::thread::sleep(Duration::from_millis(300));
        let mut s = send(&plan("b.md"));
        s.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
        let mut first = [0u8; 1];
        assert!(s.read(&mut first).is_err(), "no room yet: the request waits");
        assert!(!root.join("b.md").exists());
        // A request without a body needs no room.
        let mut bodyless = TcpStream::connect(addr).unwrap();
        bodyless
            .write_all(
                format!("POST /agentic/rollback/wf_none HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
        bodyless
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (status, body) = read_one(&mut BufReader::new(bodyless));
        assert_eq!(status, 404, "{body}");
        drop(full.pop());
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (status, body) = read_one(&mut BufReader::new(s));
        assert_eq!(status, 200, "{body}");
        assert!(root.join("b.md").exists());
        drop(full);
    })
    .await
    .unwrap();
    server.stop().await;
}

/// Uploads that stall holding the room for bodies do not hold up a small plan or a
/// rollback's body: the first 64 KiB of a body are not charged (under a body limit of
/// 1 MiB or more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_bodies_pass_uploads_that_stall_holding_the_room() {
    let e = env_with(Opts {
        write: true,
        body_limit: 1 << 20,
        ..Opts::default()
    });
    let server = Server::start(e.app.clone()).await;
    let (addr, root) = (server.addr, e.root.clone());
    tokio::task::spawn_blocking(move || {
        let limit = 1 << 20;
        let stalled: Vec<TcpStream> = (0..ailab_sandbox_http::BODIES_IN_FLIGHT)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(plan_post(addr, limit, &" ".repeat(limit - 1)).as_bytes())
                    .unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let plan = |name: &str| {
            format!(r#"{{"actions":[{{"intent":"create_file","path":"{name}","content":"x"}}]}}"#)
        };
        let mut small = TcpStream::connect(addr).unwrap();
        small
            .write_all(plan_post(addr, plan("s.md").len(), &plan("s.md")).as_bytes())
            .unwrap();
        small.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (status, body) = read_one(&mut BufReader::new(small));
        assert_eq!(status, 200, "{body}");
        assert!(root.join("s.md").exists());
        let mut undo = TcpStream::connect(addr).unwrap();
        undo.write_all(
            format!("POST /agentic/rollback/wf_none HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}")
                .as_bytes(),
        )
        .unwrap();
        undo.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (status, body) = read_one(&mut BufReader::new(undo));
        assert_eq!(status, 404, "{body}");
        // 512 KiB, more than the stalled uploads leave free: it finds room once they are
        // gone (while they stall it is answered `server_busy`, as the tests with a
        // smaller limit show).
        let large = format!("{}{}", plan("l.md"), " ".repeat(512 << 10));
        let send_large = || {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.write_all(plan_post(addr, large.len(), &large).as_bytes());
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            read_one(&mut BufReader::new(s))
        };
        drop(stalled);
        std::thread::sleep(Duration::from_millis(300));
        let (status, body) = send_large();
        assert_eq!(status, 200, "{body}");
        assert!(root.join("l.md").exists());
    })
    .await
    .unwrap();
    server.stop().await;
}

/// An upload waiting for room for its first bytes takes none until all it needs is
/// free: the uploads under way, which are answered `server_busy` rather than wait, keep
/// the free room for their last bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_under_way_is_not_starved_by_one_waiting() {
    let (e, server) = small_bodies().await;
    let (addr, root) = (server.addr, e.root.clone());
    tokio::task::spawn_blocking(move || {
        // Whole plans of exactly the body limit, padded with spaces.
        let plan = |name: &str| {
            let p = format!(
                r#"{{"actions":[{{"intent":"create_file","path":"{name}","content":"x"}}]}}"#
            );
            format!("{p}{}", " ".repeat(4096 - p.len()))
        };
        // Four uploads hold 4,000 bytes each of the 16 KiB room: 384 bytes stay free.
        let mut under_way: Vec<(TcpStream, String)> = (0..ailab_sandbox_http::BODIES_IN_FLIGHT)
            .map(|i| {
                let body = plan(&format!("held{i}.md"));
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(plan_post(addr, 4096, &body[..4000]).as_bytes())
                    .unwrap();
                (s, body[4000..].to_owned())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        // A whole body sent at once waits for room it cannot have yet.
        let mut waiting = TcpStream::connect(addr).unwrap();
        waiting
            .write_all(plan_post(addr, 4096, &plan("waited.md")).as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // A plan answered 200 within `secs`, its file written.
        let succeeds = |s: TcpStream, secs: u64, file: &str| {
            s.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
            let (status, body) = read_one(&mut BufReader::new(s));
            assert_eq!(status, 200, "{file}: {body}");
            assert!(root.join(file).exists(), "{file}");
        };
        // The first upload's last 96 bytes fit in the free room.
        let (mut first, rest) = under_way.remove(0);
        first.write_all(rest.as_bytes()).unwrap();
        succeeds(first, 10, "held0.md");
        // Its room given back, the waiting upload goes through, then the others.
        succeeds(waiting, 20, "waited.md");
        for (i, (mut s, rest)) in under_way.into_iter().enumerate() {
            s.write_all(rest.as_bytes()).unwrap();
            succeeds(s, 10, &format!("held{}.md", i + 1));
        }
    })
    .await
    .unwrap();
    server.stop().await;
}

/// However small the body limit, clients that have sent a byte of their bodies each do
/// not fill the room for bodies: room is counted in fractions of the limit, not in
/// kilobytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_clients_do_not_fill_the_room_under_a_tiny_body_limit() {
    let e = env_with(Opts {
        write: true,
        body_limit: 1024,
        ..Opts::default()
    });
    let server = Server::start(e.app.clone()).await;
    let (addr, root) = (server.addr, e.root.clone());
    tokio::task::spawn_blocking(move || {
        let post = |len: usize, body: &str| plan_post(addr, len, body);
        let trickle: Vec<TcpStream> = (0..4 * ailab_sandbox_http::BODIES_IN_FLIGHT)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(post(1000, " ").as_bytes()).unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let plan = r#"{"actions":[{"intent":"create_file","path":"t.md","content":"x"}]}"#;
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(post(plan.len(), plan).as_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (status, body) = read_one(&mut BufReader::new(s));
        assert_eq!(status, 200, "{body}");
        assert!(root.join("t.md").exists());
        drop(trickle);
    })
    .await
    .unwrap();
    server.stop().await;
}

/// A client that sends a plan and hangs up does not take its room back while its plan
/// is still parsed and run: the next body waits for it like for any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_holds_its_room_until_its_plan_has_run() {
    let (e, server) = small_bodies().await;
    let addr = server.addr;
    let (reached, at_point) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = std::sync::Mutex::new(released);
    e.sandbox.failpoints().interleave(
        "after_validate",
        std::sync::Arc::new(move || {
            let _ = reached.send(());
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(20));
        }),
    );
    tokio::task::spawn_blocking(move || {
        let post = |len: usize, body: &str| plan_post(addr, len, body);
        // A whole body of the largest size (4 of the room's 16 units), then gone.
        let plan = r#"{"actions":[{"intent":"create_file","path":"h.md","content":"x"}]}"#;
        let padded = format!("{plan:<4096}");
        let mut gone = TcpStream::connect(addr).unwrap();
        gone.write_all(post(4096, &padded).as_bytes()).unwrap();
        at_point.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(gone);
        std::thread::sleep(Duration::from_millis(300));
        // Three bodies under way take the other 12 units.
        let stalled: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(post(4096, &" ".repeat(4095)).as_bytes())
                    .unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        // Not a plan: answered 400 as soon as it has room.
        let body = r#"{"actions": 1}"#;
        let mut next = TcpStream::connect(addr).unwrap();
        next.write_all(post(body.len(), body).as_bytes()).unwrap();
        next.set_read_timeout(Some(Duration::from_millis(700)))
            .unwrap();
        let mut first = [0u8; 1];
        assert!(
            next.read(&mut first).is_err(),
            "the hung-up client's plan still holds its room"
        );
        release.send(()).unwrap();
        next.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (status, answer) = read_one(&mut BufReader::new(next));
        assert_eq!(status, 400, "{answer}");
        drop(stalled);
    })
    .await
    .unwrap();
    server.stop().await;
}

/// More uploads than there is room for, each sent in two halves: none waits for
/// another's room until the body deadline; each is answered at once, written or
/// `server_busy`, and those refused go through when sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_in_pieces_never_wait_for_each_other() {
    let (e, server) = small_bodies().await;
    let (addr, root) = (server.addr, e.root.clone());
    tokio::task::spawn_blocking(move || {
        let upload = move |i: usize, pause: Duration| {
            let plan = format!(
                r#"{{"workflow_id":"wf_p{i}","actions":[{{"intent":"create_file","path":"p{i}.md","content":"x"}}]}}"#
            );
            let body = format!("{plan:<4096}");
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(
                format!(
                    "POST /agentic/plans HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n{}",
                    &body[..2048]
                )
                .as_bytes(),
            )
            .unwrap();
            std::thread::sleep(pause);
            s.write_all(&body.as_bytes()[2048..]).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            read_one(&mut BufReader::new(s))
        };
        let clients: Vec<_> = (0..2 * ailab_sandbox_http::BODIES_IN_FLIGHT)
            .map(|i| std::thread::spawn(move || upload(i, Duration::from_millis(300))))
            .collect();
        let mut busy = Vec::new();
        for (i, c) in clients.into_iter().enumerate() {
            match c.join().unwrap() {
                (200, _) => assert!(root.join(format!("p{i}.md")).exists()),
                (503, body) if body.contains("\"server_busy\"") => busy.push(i),
                (status, body) => panic!("{i}: {status} {body}"),
            }
        }
        for i in busy {
            let (status, body) = upload(i, Duration::ZERO);
            assert_eq!(status, 200, "{i}: {body}");
            assert!(root.join(format!("p{i}.md")).exists());
        }
    })
    .await
    .unwrap();
    server.stop().await;
}

/// On a stop, a plan still waiting for its workflow's turn is answered 503 at once and
/// never runs, while the one under way (waiting for the workflow another process holds)
/// runs to its end and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answers_the_calls_still_waiting_for_their_turn() {
    let (tmp, app, _held) = workflow_held(3);
    let mut server = Server::start(app).await;
    let addr = server.addr;
    let send = |path: &str| {
        let plan = serde_json::to_string(&create_plan("wf_held", path, "x")).unwrap();
        let request = plan_post(addr, plan.len(), &plan);
        tokio::task::spawn_blocking(move || raw_http(addr, &request))
    };
    let running = send("a.txt");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = send("b.txt");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = server.stop.take().unwrap().send(());
    let (status, _, body) = waiting.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("stopping"), "{body}");
    assert!(
        !running.is_finished(),
        "answered only once the call under way ended"
    );
    let (status, _, body) = running.await.unwrap();
    assert_eq!(status, 422, "{body}");
    server.stop().await;
    assert!(!tmp.path().join("root/b.txt").exists());
}
