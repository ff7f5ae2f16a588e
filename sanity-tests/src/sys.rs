//! Small helpers around the host: external commands, files and devices
//! read and written directly, and processes.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The program `prog` on this process's `PATH` (an executable file).
pub fn which(prog: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(prog))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
        .unwrap_or_else(|| panic!("{prog} is not on PATH"))
}

/// Writes `script` as the executable `dir/name`: a stand-in for a program
/// the driver runs, found first through [`path_first`].
pub fn write_program(dir: &Path, name: &str, script: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The `PATH` entry of a driver's environment with `dir` first, then this
/// process's `PATH`.
pub fn path_first(dir: &Path) -> (String, String) {
    let path = std::env::var("PATH").unwrap_or_default();
    ("PATH".into(), format!("{}:{path}", dir.display()))
}

/// Runs an external program; panics with its output when it fails.
#[track_caller]
pub fn run_cmd(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e} (is it installed?)"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a command, true when it succeeded; output discarded (cleanup steps
/// whose failure the caller handles or may ignore).
pub fn quiet(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// statvfs: the total bytes of the filesystem at `path`.
pub fn fs_total(path: &Path) -> i64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap_or_else(|e| panic!("statvfs {path:?}: {e}"));
    (s.blocks() * s.fragment_size()) as i64
}

/// Writes dirty pages back, then drops the page cache, so the next read of
/// a device or file comes from the device itself (root; the VM tests).
pub fn drop_caches() {
    nix::unistd::sync();
    fs::write("/proc/sys/vm/drop_caches", "3").expect("writing /proc/sys/vm/drop_caches");
}

/// Writes the file `name` in `dir` and syncs it.
pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = fs::File::create(dir.join(name))?;
    f.write_all(data)?;
    f.sync_all()
}

/// Writes `data` at `offset` of a device (or file) and syncs it.
pub fn write_at(dev: &Path, offset: u64, data: &[u8]) {
    use std::io::Write as _;
    let mut f = fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// `len` bytes at `offset` of a device (or file).
pub fn read_at(dev: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).unwrap();
    b
}

/// Every process's pid and argv, from /proc (those that end meanwhile are
/// skipped).
pub fn processes() -> Vec<(i32, Vec<String>)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = fs::read(e.path().join("cmdline")).ok()?;
            let argv = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, argv))
        })
        .collect()
}

/// Whether process `pid` is gone (or a zombie).
pub fn exited(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// The live (not zombie) members of process group `pgid`: pid and command
/// name, from /proc.
pub fn group_members(pgid: i32) -> Vec<(i32, String)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            // `pid (comm) state ppid pgrp ...`; comm may hold spaces.
            let (head, rest) = stat.rsplit_once(") ")?;
            let comm = head.split_once(" (")?.1.to_owned();
            let mut f = rest.split(' ');
            let state = f.next()?;
            let pgrp: i32 = f.nth(1)?.parse().ok()?;
            (pgrp == pgid && state != "Z").then_some((pid, comm))
        })
        .collect()
}

/// Sends `sig` to `pid`, ignoring a process that is already gone.
pub fn signal_pid(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}
