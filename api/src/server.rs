//! Serves the router over TCP with limits on every connection, so that a slow or silent
//! client cannot hold a connection (and its memory) for ever:
//!
//! - the request line and headers must arrive within [`ConnectionLimits::header_read`]
//!   (slowloris);
//! - a connection on which nothing is read or written for [`ConnectionLimits::idle`] is
//!   closed (a keep-alive connection left open, or a body that stopped arriving);
//! - a request must be answered within [`ConnectionLimits::request`], body included
//!   (`408` otherwise; the `TimeoutLayer` in [`crate::app`]);
//! - at most [`ConnectionLimits::concurrent`] API requests are served at once; the others
//!   wait (within their request time), so memory grows with that number, not with the
//!   number of connections a client opens.
//!
//! Shutting down stops accepting, lets each connection finish its request in flight, and
//! closes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How long a connection may take, or sit.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read: Duration,
    pub idle: Duration,
    pub request: Duration,
    pub concurrent: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            request: Duration::from_secs(30),
            concurrent: 64,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes.
///
/// # Errors
/// Never after start: failed accepts are logged and retried.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(connection(stream, app.clone(), limits, stopped.clone()));
        while connections.try_join_next().is_some() {}
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn connection(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let last = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let io = TokioIo::new(Watched { inner: stream, last: last.clone(), started });
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let idle_for = || started.elapsed().saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
    loop {
        let check_in = limits.idle.saturating_sub(idle_for()).max(Duration::from_millis(100));
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep(check_in) => {
                if idle_for() >= limits.idle {
                    tracing::debug!("closing an idle connection");
                    return;
                }
            }
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(limits.request, conn.as_mut()).await;
                return;
            }
        }
    }
}

/// A TCP stream that records when it last moved a byte (milliseconds since `started`).
struct Watched {
    inner: TcpStream,
    last: Arc<AtomicU64>,
    started: Instant,
}

impl Watched {
    fn touch(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(now, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
