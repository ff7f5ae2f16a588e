//! The one module that runs external programs (`mkfs`, `blkid`, `lvm`, ...).
//!
//! Every program runs with `LC_ALL=C` (so its messages can be matched), without a
//! shell (arguments are passed as a vector: no user input is ever interpreted),
//! with a timeout, and is killed when its future is dropped, so a cancelled RPC
//! never leaves a child running.
//!
//! Secrets (a LUKS key) go on the child's stdin ([`Cmd::secret_stdin`]), never
//! in its arguments or environment: those are world-readable in
//! `/proc/<pid>/cmdline` and logged by [`Cmd`]'s `Debug`, stdin is neither.

use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::process::{Child, ChildStdout, Command};

/// Default limit for one external command.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Every program the driver runs, by the name it runs it as (each
/// `Cmd::new("...")` of the non-test source), sorted: what its container
/// image must hold. `tests/architecture.rs` holds this list to the source,
/// `localvol config programs` prints it for the image checks (`make
/// image-programs`, `make test-image`). A program the config names (a
/// discovery class's `cleanup` command) is the operator's, not listed.
pub const PROGRAMS: &[&str] = &[
    "blkdiscard",
    "blkid",
    "cryptsetup",
    "dd",
    "dmsetup",
    "lvm",
    "mkfs.ext4",
    "mkfs.xfs",
    "resize2fs",
    "shred",
    "thin_delta",
    "thin_dump",
    "wipefs",
    "xfs_growfs",
];

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not finish within {}s and was killed", after.as_secs())]
    Timeout { program: String, after: Duration },
    #[error("{program} failed ({}): {}", exit_text(*code), said(stderr, stdout))]
    Failed {
        program: String,
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    /// Reading a streamed program's output failed ([`Cmd::stream`]).
    #[error("reading the output of {program}: {source}")]
    Output {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a failed program said: its stderr, or its stdout when stderr is
/// empty (some tools print their errors there).
fn said<'a>(stderr: &'a str, stdout: &'a str) -> &'a str {
    match stderr.trim() {
        "" => stdout.trim(),
        s => s,
    }
}

fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit code {c}"),
        None => "killed by a signal".into(),
    }
}

impl CommandError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, CommandError::Timeout { .. })
    }
    /// The program's stderr, for callers that classify failures.
    pub fn stderr(&self) -> &str {
        match self {
            CommandError::Failed { stderr, .. } => stderr,
            _ => "",
        }
    }
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            CommandError::Failed { code, .. } => *code,
            _ => None,
        }
    }
}

/// Output of a command that exited 0.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// One invocation: program, arguments, extra environment and a timeout.
pub struct Cmd {
    program: String,
    args: Vec<OsString>,
    env: Vec<(String, OsString)>,
    timeout: Duration,
    /// Bytes written to the child's stdin (then closed); None: `/dev/null`.
    /// Never shown by `Debug`, overwritten with zeroes once written.
    stdin: Option<Vec<u8>>,
}

impl fmt::Debug for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program)?;
        for a in &self.args {
            write!(f, " {}", a.to_string_lossy())?;
        }
        if self.stdin.is_some() {
            write!(f, " <secret on stdin>")?;
        }
        Ok(())
    }
}

impl Cmd {
    pub fn new(program: &str) -> Self {
        Cmd {
            program: program.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            stdin: None,
        }
    }
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn args<I, A>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.args.extend(it.into_iter().map(Into::into));
        self
    }
    pub fn env(mut self, k: &str, v: impl Into<OsString>) -> Self {
        self.env.push((k.to_owned(), v.into()));
        self
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Feeds `bytes` to the child's stdin and closes it: the way a secret
    /// reaches a program (`cryptsetup --key-file -`). The command's `Debug`
    /// (what the log shows) says only that there is one.
    pub fn secret_stdin(mut self, bytes: &[u8]) -> Self {
        self.stdin = Some(bytes.to_vec());
        self
    }
    /// The arguments, as the child will see them in its `argv` (tests).
    pub fn argv(&self) -> impl Iterator<Item = &OsString> {
        self.args.iter()
    }
    /// How long the command may run before it is killed (tests).
    pub fn limit(&self) -> Duration {
        self.timeout
    }

    /// Spawns the program with its arguments and extra environment, in the
    /// C locale and killed when its handle is dropped: how every way of
    /// running one here ([`Cmd::run`], [`Cmd::start`], [`Cmd::stream`])
    /// starts it.
    fn spawn(&self, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> Result<Child, CommandError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .env("LC_ALL", "C")
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.spawn().map_err(|source| CommandError::Spawn {
            program: self.program.clone(),
            source,
        })
    }

    /// Runs the command; a non-zero exit is an error carrying stderr.
    pub async fn run(mut self) -> Result<Output, CommandError> {
        let input = if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        tracing::debug!(command = ?self, "running");
        let mut child = self.spawn(input, Stdio::piped(), Stdio::piped())?;
        let feed = feed_stdin(child.stdin.take(), self.stdin.take());
        let run = async {
            // Fed concurrently with the wait, so a child that reads its
            // input late, or never, cannot block the other. A child that
            // exits without reading breaks the pipe: its exit status says
            // what happened, so the write's error is not the answer.
            let (_, out) = tokio::join!(feed, child.wait_with_output());
            out
        };
        let out = match tokio::time::timeout(self.timeout, run).await {
            Ok(r) => r.map_err(|source| CommandError::Spawn {
                program: self.program.clone(),
                source,
            })?,
            // Dropping the wait future drops the child, and kill_on_drop kills it.
            Err(_) => {
                return Err(CommandError::Timeout {
                    program: self.program,
                    after: self.timeout,
                })
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            Ok(Output { stdout, stderr })
        } else {
            Err(CommandError::Failed {
                program: self.program,
                code: out.status.code(),
                stdout,
                stderr,
            })
        }
    }
}

/// A program left running by [`Cmd::start`] (the bench's driver under test):
/// killed when dropped, like every other child. Only `localvol bench` (the
/// `cli/` crate) starts one; it stays here so that every child the binary
/// runs gets this module's kill-on-drop.
pub struct Running {
    program: String,
    child: tokio::process::Child,
}

impl Cmd {
    /// Starts the program and returns at once, for a server that runs until
    /// [`Running::stop`]; the timeout does not apply. Its stdout and stderr
    /// are appended to `log` (created if missing), or dropped.
    pub fn start(self, log: Option<&Path>) -> Result<Running, CommandError> {
        let spawn_err = |source| CommandError::Spawn {
            program: self.program.clone(),
            source,
        };
        let (out, err) = match log {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(spawn_err)?;
                let f2 = f.try_clone().map_err(spawn_err)?;
                (Stdio::from(f), Stdio::from(f2))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        tracing::debug!(command = ?self, "starting");
        let child = self.spawn(Stdio::null(), out, err)?;
        Ok(Running {
            program: self.program,
            child,
        })
    }
}

impl Running {
    /// The process id (None once it has been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// How it ended, if it already has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Asks it to end (SIGTERM), waits up to `grace`, then kills it.
    pub async fn stop(mut self, grace: Duration) -> Result<ExitStatus, CommandError> {
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        let spawn_err = |source| CommandError::Spawn {
            program: self.program.clone(),
            source,
        };
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(r) => r.map_err(spawn_err),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(CommandError::Timeout {
                    program: self.program.clone(),
                    after: grace,
                })
            }
        }
    }
}

/// The most of a streamed program's stderr that is kept for its error.
const STDERR_KEPT: usize = 64 << 10;

/// A program whose stdout is read as it comes ([`Cmd::stream`]): for output
/// too large to hold (a thin pool's block map of a volume of terabytes). It
/// reads as [`AsyncRead`]; the consumer's own pace is the pace of the
/// program (a full pipe stops it). The time limit is a stall limit: a read
/// that gets nothing for the command's timeout fails with `TimedOut` (a
/// hung device), however long the whole output takes. Killed when dropped,
/// like every child.
pub struct Streaming {
    program: String,
    child: tokio::process::Child,
    stdout: ChildStdout,
    limit: Duration,
    /// When the read under way gives up; set as a read starts.
    stall: Pin<Box<tokio::time::Sleep>>,
    waiting: bool,
    /// Drains stderr (so a chatty child never blocks on it), keeping the
    /// first [`STDERR_KEPT`] bytes.
    stderr: tokio::task::JoinHandle<Vec<u8>>,
}

impl Cmd {
    /// Starts the program with its stdout to be read as a stream
    /// ([`Streaming`]); stdin is `/dev/null` (no secret goes to a streamed
    /// program). [`Streaming::finish`] then says how it ended.
    pub fn stream(self) -> Result<Streaming, CommandError> {
        tracing::debug!(command = ?self, "streaming");
        let mut child = self.spawn(Stdio::null(), Stdio::piped(), Stdio::piped())?;
        let (Some(stdout), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(CommandError::Output {
                program: self.program,
                source: std::io::Error::other("no pipe to the child"),
            });
        };
        let stderr = tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = err.read(&mut buf).await {
                let room = STDERR_KEPT.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
            }
            kept
        });
        Ok(Streaming {
            program: self.program,
            child,
            stdout,
            limit: self.timeout,
            stall: Box::pin(tokio::time::sleep(self.timeout)),
            waiting: false,
            stderr,
        })
    }
}

impl Streaming {
    /// The error of a failed read of its output (a stall is a timeout).
    pub fn read_error(&self, source: std::io::Error) -> CommandError {
        if source.kind() == std::io::ErrorKind::TimedOut {
            return CommandError::Timeout {
                program: self.program.clone(),
                after: self.limit,
            };
        }
        CommandError::Output {
            program: self.program.clone(),
            source,
        }
    }

    /// Waits for the program to exit (within its time limit; killed past
    /// it) once its output was read to the end: an exit other than 0 is
    /// [`CommandError::Failed`] with its stderr.
    pub async fn finish(mut self) -> Result<(), CommandError> {
        let status = match tokio::time::timeout(self.limit, self.child.wait()).await {
            Ok(r) => r.map_err(|source| CommandError::Spawn {
                program: self.program.clone(),
                source,
            })?,
            Err(_) => {
                let _ = self.child.kill().await;
                return Err(CommandError::Timeout {
                    program: self.program.clone(),
                    after: self.limit,
                });
            }
        };
        let stderr = (&mut self.stderr).await.unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        Err(CommandError::Failed {
            program: self.program.clone(),
            code: status.code(),
            stdout: String::new(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }
}

impl AsyncRead for Streaming {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.waiting {
            // A new read: the limit counts from now, not from the last one
            // (the consumer may have been slow in between).
            let at = tokio::time::Instant::now() + this.limit;
            this.stall.as_mut().reset(at);
            this.waiting = true;
        }
        match Pin::new(&mut this.stdout).poll_read(cx, buf) {
            Poll::Ready(r) => {
                this.waiting = false;
                Poll::Ready(r)
            }
            Poll::Pending => match this.stall.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.waiting = false;
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no output for {}s", this.limit.as_secs()),
                    )))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        // The child is killed by kill_on_drop; its stderr reader ends with
        // the pipe, or here.
        self.stderr.abort();
    }
}

/// Writes `bytes` into the child's stdin, closes it and overwrites the bytes.
async fn feed_stdin(pipe: Option<tokio::process::ChildStdin>, bytes: Option<Vec<u8>>) {
    use tokio::io::AsyncWriteExt;
    let Some(mut bytes) = bytes else { return };
    if let Some(mut pipe) = pipe {
        let _ = pipe.write_all(&bytes).await;
        let _ = pipe.shutdown().await;
    }
    bytes.iter_mut().for_each(|b| *b = 0);
    std::hint::black_box(&bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn captures_output_and_uses_c_locale() {
        let out = Cmd::new("sh")
            .args(["-c", "echo $LC_ALL"])
            .run()
            .await
            .unwrap();
        assert_eq!(out.stdout.trim(), "C");
    }

    #[tokio::test]
    async fn arguments_are_not_interpreted_by_a_shell() {
        let out = Cmd::new("echo").arg("$(id); rm -rf /").run().await.unwrap();
        assert_eq!(out.stdout.trim(), "$(id); rm -rf /");
    }

    #[tokio::test]
    async fn failure_carries_code_and_stderr() {
        let err = Cmd::new("sh")
            .args(["-c", "echo boom >&2; exit 3"])
            .run()
            .await
            .unwrap_err();
        assert_eq!(err.exit_code(), Some(3));
        assert_eq!(err.stderr().trim(), "boom");
        assert!(err.to_string().contains("exit code 3"), "{err}");
    }

    #[tokio::test]
    async fn timeout_kills_the_child() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
        let err = Cmd::new("sh")
            .args(["-c", &script])
            .timeout(Duration::from_millis(300))
            .run()
            .await
            .unwrap_err();
        assert!(err.is_timeout());
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The child was killed and reaped by tokio's orphan reaper; give it a moment.
        let mut gone = false;
        for _ in 0..50 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "child {pid} still running after timeout");
    }

    /// A secret reaches the child on stdin only: not in its argv, not in its
    /// environment, not in what the log prints of the command.
    #[tokio::test]
    async fn secret_goes_on_stdin_and_nowhere_else() {
        let secret = "s3cr3t-key-material";
        let cmd = Cmd::new("sh")
            .args([
                "-c",
                "cat; printf '|'; cat /proc/$$/cmdline | tr '\\0' ' '; printf '|'; cat /proc/$$/environ | tr '\\0' ' '",
            ])
            .secret_stdin(secret.as_bytes());
        let shown = format!("{cmd:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("<secret on stdin>"), "{shown}");
        assert!(cmd.argv().all(|a| !a.to_string_lossy().contains(secret)));
        let out = cmd.run().await.unwrap();
        let mut parts = out.stdout.split('|');
        assert_eq!(parts.next(), Some(secret), "the child read it on stdin");
        let (argv, env) = (parts.next().unwrap(), parts.next().unwrap());
        assert!(argv.starts_with("sh -c"), "{argv}");
        assert!(!argv.contains(secret) && !env.contains(secret));
    }

    #[tokio::test]
    async fn stdin_is_empty_without_a_secret() {
        let out = Cmd::new("cat").run().await.unwrap();
        assert_eq!(out.stdout, "");
    }

    #[tokio::test]
    async fn started_program_runs_until_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut r = Cmd::new("sh")
            .args(["-c", "echo up; exec sleep 30"])
            .start(Some(&log))
            .unwrap();
        assert!(r.pid().is_some());
        let mut up = false;
        for _ in 0..100 {
            up = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("up");
            if up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(up, "no output in the log");
        assert!(r.exited().is_none());
        let status = r.stop(Duration::from_secs(5)).await.unwrap();
        assert!(!status.success(), "ended by SIGTERM: {status}");
    }

    #[tokio::test]
    async fn streamed_output_is_read_as_it_comes_and_the_exit_checked() {
        use tokio::io::AsyncBufReadExt;
        let s = Cmd::new("sh")
            .args([
                "-c",
                "for i in 1 2 3; do echo line$i; done; echo oops >&2; exit 4",
            ])
            .stream()
            .unwrap();
        let mut r = tokio::io::BufReader::new(s);
        let mut lines = Vec::new();
        let mut l = String::new();
        while r.read_line(&mut l).await.unwrap() > 0 {
            lines.push(l.trim().to_owned());
            l.clear();
        }
        assert_eq!(lines, ["line1", "line2", "line3"]);
        let err = r.into_inner().finish().await.unwrap_err();
        assert_eq!(err.exit_code(), Some(4));
        assert_eq!(err.stderr().trim(), "oops");
        let ok = Cmd::new("true").stream().unwrap();
        ok.finish().await.unwrap();
    }

    #[tokio::test]
    async fn a_stalled_stream_times_out_and_its_child_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("echo $$ > {}; echo first; exec sleep 30", pidfile.display());
        let mut s = Cmd::new("sh")
            .args(["-c", &script])
            .timeout(Duration::from_millis(300))
            .stream()
            .unwrap();
        let mut buf = vec![0u8; 64];
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"first\n");
        let e = s.read(&mut buf).await.unwrap_err();
        assert!(s.read_error(e).is_timeout());
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        drop(s);
        let mut gone = false;
        for _ in 0..50 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            gone,
            "child {pid} still running after the stream was dropped"
        );
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let err = Cmd::new("/nonexistent/prog").run().await.unwrap_err();
        assert!(matches!(err, CommandError::Spawn { .. }));
    }
}
