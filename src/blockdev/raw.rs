//! The one place `wipefs`, `dd`, `blkdiscard` and `shred` are run: the
//! programs that write a device's blocks directly (signatures erased,
//! zeroes, a block copy, discarded or overwritten blocks), for the LVM
//! pools (a cut-short create finished, restores and clones) and static
//! discovery's cleanup. Each command's arguments and timeout are
//! built here and nowhere else, and [`copy_running`] recognises a copy of
//! [`copy`]'s by the same arguments.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::command::{Cmd, CommandError};

/// How long one block copy ([`copy`]) may take: a whole volume's data.
const COPY_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// `key=` followed by a path, as one argument (a path need not be UTF-8).
fn keyed(key: &str, path: &Path) -> OsString {
    let mut a = OsString::from(key);
    a.push(path.as_os_str());
    a
}

/// Erases every signature on `dev` (`wipefs --all --force`), with the
/// default timeout.
pub async fn erase_signatures(dev: &Path) -> Result<(), CommandError> {
    erase_signatures_command(dev).run().await.map(drop)
}

fn erase_signatures_command(dev: &Path) -> Cmd {
    Cmd::new("wipefs")
        .args(["--all", "--force", "--quiet"])
        .arg(dev)
}

/// Zeroes the first 4 KiB of `dev`, written through (`oflag=direct`,
/// `fsync`), with the default timeout.
pub async fn zero_start(dev: &Path) -> Result<(), CommandError> {
    zero_start_command(dev).run().await.map(drop)
}

fn zero_start_command(dev: &Path) -> Cmd {
    Cmd::new("dd")
        .args(["if=/dev/zero", "bs=4096", "count=1", "oflag=direct"])
        .args(["conv=fsync,notrunc", "status=none"])
        .arg(keyed("of=", dev))
}

/// Zeroes the first `bytes` of `dev`, written through, within `timeout`.
pub async fn zero(dev: &Path, bytes: u64, timeout: Duration) -> Result<(), CommandError> {
    zero_command(dev, bytes, timeout).run().await.map(drop)
}

fn zero_command(dev: &Path, bytes: u64, timeout: Duration) -> Cmd {
    Cmd::new("dd")
        .arg("if=/dev/zero")
        .arg(keyed("of=", dev))
        .args([
            "bs=1M".to_string(),
            format!("count={bytes}"),
            "iflag=count_bytes".into(),
            "oflag=direct".into(),
            "conv=fsync,notrunc".into(),
            "status=none".into(),
        ])
        .timeout(timeout)
}

/// Discards every block of `dev` (static discovery's `blkdiscard` cleanup),
/// within `timeout`.
pub async fn discard(dev: &Path, timeout: Duration) -> Result<(), CommandError> {
    Cmd::new("blkdiscard")
        .arg(dev.as_os_str())
        .timeout(timeout)
        .run()
        .await
        .map(drop)
}

/// Overwrites `dev` once with random data, then with zeroes (static
/// discovery's `shred` cleanup), within `timeout`.
pub async fn shred(dev: &Path, timeout: Duration) -> Result<(), CommandError> {
    Cmd::new("shred")
        .args(["--iterations=1", "--zero", "--"])
        .arg(dev.as_os_str())
        .timeout(timeout)
        .run()
        .await
        .map(drop)
}

/// Copies the first `bytes` of `from` onto `to`, written through; a whole
/// volume may take up to a day.
pub async fn copy(from: &Path, to: &Path, bytes: u64) -> Result<(), CommandError> {
    copy_command(from, to, bytes).run().await.map(drop)
}

fn copy_command(from: &Path, to: &Path, bytes: u64) -> Cmd {
    Cmd::new("dd")
        .arg(keyed("if=", from))
        .arg(keyed("of=", to))
        .args([
            "bs=4M",
            "iflag=count_bytes",
            "oflag=direct",
            "conv=fsync,notrunc",
            "status=none",
        ])
        .arg(format!("count={bytes}"))
        .timeout(COPY_TIMEOUT)
}

/// Whether a `dd` writing to `to` runs, as seen in `proc`'s
/// `<pid>/cmdline` files: a [`copy`] a killed driver left behind (blocking).
pub fn copy_running(proc: &Path, to: &Path) -> bool {
    let target = keyed("of=", to);
    let target = std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str());
    let Ok(entries) = std::fs::read_dir(proc) else {
        return false;
    };
    entries.flatten().any(|e| {
        let is_pid = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let mut args = c.split(|&b| b == 0);
                let is_dd = args
                    .next()
                    .is_some_and(|a0| a0 == b"dd" || a0.ends_with(b"/dd"));
                is_dd && args.any(|a| a == target)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact command lines, as they were when each caller built its own.
    #[test]
    fn command_lines_and_timeouts() {
        let dev = Path::new("/dev/vg/lv-a");
        let cases = [
            (
                erase_signatures_command(dev),
                "wipefs --all --force --quiet /dev/vg/lv-a",
                crate::command::DEFAULT_TIMEOUT,
            ),
            (
                zero_start_command(dev),
                "dd if=/dev/zero bs=4096 count=1 oflag=direct conv=fsync,notrunc status=none \
                 of=/dev/vg/lv-a",
                crate::command::DEFAULT_TIMEOUT,
            ),
            (
                zero_command(dev, 5 << 20, Duration::from_secs(7)),
                "dd if=/dev/zero of=/dev/vg/lv-a bs=1M count=5242880 iflag=count_bytes \
                 oflag=direct conv=fsync,notrunc status=none",
                Duration::from_secs(7),
            ),
            (
                copy_command(Path::new("/dev/vg/sn-a"), dev, 4096),
                "dd if=/dev/vg/sn-a of=/dev/vg/lv-a bs=4M iflag=count_bytes oflag=direct \
                 conv=fsync,notrunc status=none count=4096",
                Duration::from_secs(24 * 3600),
            ),
        ];
        for (cmd, line, timeout) in cases {
            assert_eq!(format!("{cmd:?}"), line);
            assert_eq!(cmd.limit(), timeout, "{line}");
        }
    }

    #[test]
    fn a_leftover_copy_is_found_by_its_target() {
        let proc = tempfile::tempdir().unwrap();
        let pid = |n: &str, cmdline: &[u8]| {
            std::fs::create_dir(proc.path().join(n)).unwrap();
            std::fs::write(proc.path().join(n).join("cmdline"), cmdline).unwrap();
        };
        pid("self", b"dd\0of=/dev/vg/lv-a\0");
        pid(
            "12",
            b"/usr/bin/dd\0if=/dev/vg/sn-b\0of=/dev/vg/lv-b\0bs=4M\0",
        );
        pid("13", b"cat\0of=/dev/vg/lv-c\0");
        pid("14", b"");
        let t = proc.path();
        let dev = |lv: &str| Path::new("/dev/vg").join(lv);
        assert!(copy_running(t, &dev("lv-b")));
        assert!(!copy_running(t, &dev("lv-a")), "not a pid dir");
        assert!(!copy_running(t, &dev("lv-c")), "not dd");
        assert!(!copy_running(t, &dev("lv-bb")));
        assert!(!copy_running(&t.join("missing"), &dev("lv-b")));
    }
}
