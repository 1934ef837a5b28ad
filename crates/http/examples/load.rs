//! A bounded load generator for the HTTP face (not a timed test).
//!
//! Starts the server in-process on `127.0.0.1:0` over a temporary sandbox root preloaded
//! with 200 artifacts (20 workflows of 10 files), then, for `GET /agentic/artifacts?limit=50`
//! and `GET /agentic/state`, with 1 and 4 client threads, sends a fixed number of requests
//! over keep-alive connections (raw HTTP/1.1 on `std::net::TcpStream`), capped in time, and
//! prints requests per second and p50/p99 latency.
//!
//! ```text
//! cargo run --release -p ailab-sandbox-http --example load [REQUESTS] [SECONDS]
//! ```
//! `REQUESTS` per scenario (default 20000), `SECONDS` cap per scenario (default 15).

use ailab_sandbox_core::config::Durability;
use ailab_sandbox_core::{Config, Sandbox};
use std::error::Error;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const WORKFLOWS: usize = 20;
const FILES_PER_WORKFLOW: usize = 10;
const WARMUP: usize = 200;

fn preload(sandbox: &Sandbox) -> Res<()> {
    for w in 0..WORKFLOWS {
        let actions: Vec<_> = (0..FILES_PER_WORKFLOW)
            .map(|i| {
                serde_json::json!({
                    "action_id": format!("a{i}"),
                    "intent": "create_file",
                    "path": format!("load/wf{w}/file{i}.md"),
                    "content": format!("# file {i} of workflow {w}\n{}\n", "lorem ipsum ".repeat(20)),
                })
            })
            .collect();
        let plan = serde_json::json!({"workflow_id": format!("wf_load_{w}"), "actions": actions});
        let result = sandbox
            .run_plan_json(&serde_json::to_vec(&plan)?)
            .map_err(|r| format!("preload refused: {r}"))?;
        if !result.is_success() {
            return Err(format!("preload run ended {:?}", result.status).into());
        }
    }
    Ok(())
}

/// Reads one response (body by Content-Length) and returns its status.
fn read_response(r: &mut BufReader<TcpStream>, body: &mut Vec<u8>) -> Res<u16> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split(' ').nth(1).ok_or("no status line")?.parse()?;
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse()?;
        }
    }
    body.resize(len, 0);
    r.read_exact(body)?;
    Ok(status)
}

struct Outcome {
    latencies: Vec<Duration>,
    elapsed: Duration,
    bytes: usize,
}

/// `threads` keep-alive clients share `total` requests; stops early at `cap`.
fn scenario(
    addr: SocketAddr,
    path: &str,
    threads: usize,
    total: usize,
    cap: Duration,
) -> Res<Outcome> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes();
    // Warm-up on one connection.
    {
        let s = TcpStream::connect(addr)?;
        let mut w = s.try_clone()?;
        let mut r = BufReader::new(s);
        let mut body = Vec::new();
        for _ in 0..WARMUP {
            w.write_all(&request)?;
            read_response(&mut r, &mut body)?;
        }
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + cap;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            let request = request.clone();
            std::thread::spawn(move || -> Res<(Vec<Duration>, usize)> {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                let mut w = s.try_clone()?;
                let mut r = BufReader::new(s);
                let mut body = Vec::new();
                let mut latencies = Vec::with_capacity(total / threads + 1);
                let mut bytes = 0;
                while next.fetch_add(1, Ordering::Relaxed) < total && Instant::now() < deadline {
                    let t = Instant::now();
                    w.write_all(&request)?;
                    let status = read_response(&mut r, &mut body)?;
                    latencies.push(t.elapsed());
                    if status != 200 {
                        return Err(
                            format!("status {status}: {}", String::from_utf8_lossy(&body)).into(),
                        );
                    }
                    bytes += body.len();
                }
                Ok((latencies, bytes))
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut bytes = 0;
    for h in handles {
        let (l, b) = h.join().map_err(|_| "a client thread panicked")??;
        latencies.extend(l);
        bytes += b;
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Ok(Outcome {
        latencies,
        elapsed,
        bytes,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let total: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let cap = Duration::from_secs(args.next().map(|a| a.parse()).transpose()?.unwrap_or(15));

    let tmp = tempfile::tempdir()?;
    let mut config = Config::with_roots(vec![tmp.path().join("root")], tmp.path().join("state"));
    config.enable_write = true;
    config.dry_run = false;
    config.durability = Durability::Relaxed;
    let sandbox = Arc::new(Sandbox::open(config)?);
    let t = Instant::now();
    preload(&sandbox)?;
    let artifacts = sandbox.artifacts(1000, None)?.len();
    eprintln!("preloaded {artifacts} artifacts in {:?}", t.elapsed());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let app = ailab_sandbox_http::router(sandbox, None, ailab_sandbox_http::DEFAULT_BODY_LIMIT);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(ailab_sandbox_http::serve(listener, app, async move {
        let _ = stopped.await;
    }));

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "HTTP load: server and clients on one machine ({cores} cores), {total} requests per scenario (cap {cap:?}), keep-alive, after {WARMUP} warm-up requests\n"
    );
    println!("| route | client threads | requests | req/s | p50 | p99 | body bytes |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for path in ["/agentic/artifacts?limit=50", "/agentic/state"] {
        for threads in [1, 4] {
            let o = scenario(addr, path, threads, total, cap)?;
            let rps = o.latencies.len() as f64 / o.elapsed.as_secs_f64();
            println!(
                "| `GET {path}` | {threads} | {} | {rps:.0} | {:.3} ms | {:.3} ms | {} |",
                o.latencies.len(),
                percentile(&o.latencies, 50.0).as_secs_f64() * 1e3,
                percentile(&o.latencies, 99.0).as_secs_f64() * 1e3,
                o.bytes / o.latencies.len().max(1),
            );
        }
    }
    let _ = stop.send(());
    rt.block_on(server)??;
    Ok(())
}
