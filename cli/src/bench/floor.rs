//! The syscall floor (`--floor`): the same filesystem work as a directory
//! volume's lifecycle, with raw syscalls and no driver.

use super::*;

pub(super) async fn run_floor(
    args: &BenchArgs,
    dirs: &RunDir,
    abort: Arc<AtomicBool>,
) -> Result<Report, String> {
    let volumes = dirs
        .volumes
        .clone()
        .ok_or_else(|| "floor mode without a volumes dir".to_owned())?;
    let (staging, targets) = (dirs.staging.clone(), dirs.targets.clone());
    let n = usize::try_from(args.volumes).map_err(|e| e.to_string())?;
    let c = args.concurrency;
    let (samples, errors, wall) = tokio::task::spawn_blocking(move || {
        let next = AtomicUsize::new(0);
        let start = Instant::now();
        let results: Vec<(Samples, Result<(), String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..c)
                .map(|_| {
                    let (next, abort) = (&next, &abort);
                    let (volumes, staging, targets) = (&volumes, &staging, &targets);
                    scope.spawn(move || {
                        let mut samples = Samples::default();
                        while !abort.load(Ordering::SeqCst) {
                            let i = next.fetch_add(1, Ordering::SeqCst);
                            if i >= n {
                                break;
                            }
                            let name = i.to_string();
                            let paths = FloorPaths {
                                volume: volumes.join(&name),
                                staging: staging.join(&name),
                                target: targets.join(&name),
                            };
                            if let Err(e) = floor_lifecycle(&paths, &mut samples) {
                                abort.store(true, Ordering::SeqCst);
                                return (samples, Err(format!("lifecycle {i}: {e}")));
                            }
                        }
                        (samples, Ok(()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| (Samples::default(), Err("worker panicked".to_owned())))
                })
                .collect()
        });
        let wall = start.elapsed();
        let mut all = Samples::default();
        let mut errors = Vec::new();
        for (s, r) in results {
            all.merge(s);
            if let Err(e) = r {
                errors.push(e);
            }
        }
        (all, errors, wall)
    })
    .await
    .map_err(|e| format!("floor workers: {e}"))?;
    if let Some(e) = first_error(&errors) {
        return Err(e);
    }
    let mut report = Report::new("floor", &FLOOR_STEPS, &samples, wall)
        .ok_or_else(|| "no lifecycle completed".to_owned())?;
    report.volumes = args.volumes;
    report.concurrency = args.concurrency;
    Ok(report)
}

pub(super) struct FloorPaths {
    pub(super) volume: PathBuf,
    pub(super) staging: PathBuf,
    pub(super) target: PathBuf,
}

/// What a floor lifecycle has made so far, for cleanup.
#[derive(Default)]
pub(super) struct FloorProgress {
    pub(super) volume: bool,
    pub(super) staging: bool,
    pub(super) staged: bool,
    pub(super) target: bool,
    pub(super) published: bool,
}

pub(super) fn floor_lifecycle(p: &FloorPaths, samples: &mut Samples) -> Result<(), String> {
    let mut done = FloorProgress::default();
    let res = floor_steps(p, samples, &mut done);
    if res.is_err() {
        // Best effort, innermost first.
        if done.published {
            let _ = localvol::mount::unmount(&p.target);
        }
        if done.target {
            let _ = rmdir(&p.target);
        }
        if done.staged {
            let _ = localvol::mount::unmount(&p.staging);
        }
        if done.staging {
            let _ = rmdir(&p.staging);
        }
        if done.volume {
            let _ = rmdir(&p.volume);
        }
    }
    res
}

pub(super) fn floor_steps(
    p: &FloorPaths,
    samples: &mut Samples,
    done: &mut FloorProgress,
) -> Result<(), String> {
    let mkdir = |d: &Path| std::fs::create_dir(d).map_err(|e| format!("mkdir {d:?}: {e}"));
    let rm = |d: &Path| std::fs::remove_dir(d).map_err(|e| format!("rmdir {d:?}: {e}"));
    let bind = |s: &Path, t: &Path| {
        localvol::mount::bind(s, t, MountFlags::empty()).map_err(|e| e.to_string())
    };
    let umount = |t: &Path| localvol::mount::unmount(t).map_err(|e| e.to_string());
    let lifecycle = Instant::now();

    let start = Instant::now();
    mkdir(&p.volume)?;
    done.volume = true;
    samples.steps[CREATE].push(start.elapsed());

    let start = Instant::now();
    mkdir(&p.staging)?;
    done.staging = true;
    bind(&p.volume, &p.staging)?;
    done.staged = true;
    samples.steps[STAGE].push(start.elapsed());

    let start = Instant::now();
    mkdir(&p.target)?;
    done.target = true;
    bind(&p.staging, &p.target)?;
    done.published = true;
    samples.steps[PUBLISH].push(start.elapsed());

    let start = Instant::now();
    umount(&p.target)?;
    done.published = false;
    rm(&p.target)?;
    done.target = false;
    samples.steps[UNPUBLISH].push(start.elapsed());

    let start = Instant::now();
    umount(&p.staging)?;
    done.staged = false;
    rm(&p.staging)?;
    done.staging = false;
    samples.steps[UNSTAGE].push(start.elapsed());

    let start = Instant::now();
    rm(&p.volume)?;
    done.volume = false;
    samples.steps[DELETE].push(start.elapsed());

    samples.lifecycles.push(lifecycle.elapsed());
    Ok(())
}
