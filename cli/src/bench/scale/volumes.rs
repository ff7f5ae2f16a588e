//! Making and removing a scenario's volumes: each lifecycle step timed
//! (requests from `crate::requests`), many at a time in order, and the
//! undo of what a failed step left.

use super::*;

/// What creating and mounting a scenario's volumes needs.
pub(super) struct Ctx {
    pub(super) clients: Clients,
    pub(super) capability: csi::VolumeCapability,
    pub(super) parameters: HashMap<String, String>,
    pub(super) size: i64,
    pub(super) stage_unstage: bool,
    pub(super) staging: PathBuf,
    pub(super) targets: PathBuf,
    /// The volume context of node requests: none (the scenarios do not
    /// keep what CreateVolume answered).
    pub(super) no_context: HashMap<String, String>,
}

/// One volume a scenario made, and how far it got.
#[derive(Clone, Debug, Default)]
pub(super) struct Vol {
    pub(super) id: String,
    pub(super) staging: PathBuf,
    pub(super) target: PathBuf,
    pub(super) staged: bool,
    pub(super) published: bool,
}

pub(super) fn rpc_err(what: &str, s: tonic::Status) -> String {
    format!("{what}: {}: {}", code_name(s.code()), s.message())
}

impl Ctx {
    pub(super) fn new(c: &Common, t: &Target, dirs: &RunDir) -> Result<Ctx, String> {
        Ok(Ctx {
            clients: t.clients.clone(),
            capability: client::CapabilityArgs {
                fs: (!c.block).then(|| c.fs_type.clone()),
                block: c.block,
                ..Default::default()
            }
            .to_csi(),
            parameters: client::param_map(None, &c.params)?,
            size: c.size,
            stage_unstage: t.stage_unstage,
            staging: dirs.staging.clone(),
            targets: dirs.targets.clone(),
            no_context: HashMap::new(),
        })
    }

    pub(super) fn node_volume<'a>(&'a self, v: &'a Vol) -> NodeVolume<'a> {
        NodeVolume {
            id: &v.id,
            capability: &self.capability,
            context: &self.no_context,
        }
    }

    pub(super) async fn create(&self, name: String) -> Result<(Vol, Duration), String> {
        self.create_from(name, None).await
    }

    /// CreateVolume with a content source (a restore or a clone), timed.
    pub(super) async fn create_from(
        &self,
        name: String,
        source: Option<csi::VolumeContentSource>,
    ) -> Result<(Vol, Duration), String> {
        let mut ctl = self.clients.controller.clone();
        let req = requests::create(
            &name,
            Some((self.size, 0)),
            &self.capability,
            self.parameters.clone(),
            source,
        );
        let start = Instant::now();
        let r = client::call(self.clients.timeout, req, |r| ctl.create_volume(r))
            .await
            .map_err(|s| rpc_err(&format!("CreateVolume {name}"), s))?;
        let took = start.elapsed();
        let id = r
            .volume
            .ok_or_else(|| "CreateVolume answered without a volume".to_owned())?
            .volume_id;
        Ok((
            Vol {
                id,
                staging: self.staging.join(&name),
                target: self.targets.join(&name),
                ..Vol::default()
            },
            took,
        ))
    }

    /// mkdir of the staging path (as kubelet does), then NodeStageVolume (timed).
    pub(super) async fn stage(&self, v: &mut Vol) -> Result<Duration, String> {
        if !self.stage_unstage {
            return Ok(Duration::ZERO);
        }
        std::fs::create_dir(&v.staging).map_err(|e| format!("creating {:?}: {e}", v.staging))?;
        v.staged = true;
        let mut node = self.clients.node.clone();
        let req = requests::stage(self.node_volume(v), &path_str(&v.staging)?, HashMap::new());
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_stage_volume(r))
            .await
            .map_err(|s| rpc_err("NodeStageVolume", s))?;
        Ok(start.elapsed())
    }

    pub(super) async fn publish(&self, v: &mut Vol) -> Result<Duration, String> {
        let mut node = self.clients.node.clone();
        v.published = true;
        let staging = match self.stage_unstage {
            true => Some(path_str(&v.staging)?),
            false => None,
        };
        let target = path_str(&v.target)?;
        let req = requests::publish(self.node_volume(v), staging.as_deref(), &target, false);
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_publish_volume(r))
            .await
            .map_err(|s| rpc_err("NodePublishVolume", s))?;
        Ok(start.elapsed())
    }

    /// NodeUnpublishVolume (timed), then rmdir of the target if the driver left it.
    pub(super) async fn unpublish(&self, v: &mut Vol) -> Result<Duration, String> {
        let mut node = self.clients.node.clone();
        let req = requests::unpublish(&v.id, &path_str(&v.target)?);
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_unpublish_volume(r))
            .await
            .map_err(|s| rpc_err("NodeUnpublishVolume", s))?;
        let took = start.elapsed();
        v.published = false;
        crate::bench::rmdir(&v.target).map_err(|e| format!("removing {:?}: {e}", v.target))?;
        Ok(took)
    }

    /// NodeUnstageVolume (timed), then rmdir of the staging path.
    pub(super) async fn unstage(&self, v: &mut Vol) -> Result<Duration, String> {
        if !v.staged {
            return Ok(Duration::ZERO);
        }
        let mut node = self.clients.node.clone();
        let req = requests::unstage(&v.id, &path_str(&v.staging)?);
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| node.node_unstage_volume(r))
            .await
            .map_err(|s| rpc_err("NodeUnstageVolume", s))?;
        let took = start.elapsed();
        crate::bench::rmdir(&v.staging).map_err(|e| format!("removing {:?}: {e}", v.staging))?;
        v.staged = false;
        Ok(took)
    }

    pub(super) async fn delete(&self, id: &str) -> Result<Duration, String> {
        let mut ctl = self.clients.controller.clone();
        let req = requests::delete(id);
        let start = Instant::now();
        client::call(self.clients.timeout, req, |r| ctl.delete_volume(r))
            .await
            .map_err(|s| rpc_err(&format!("DeleteVolume {id}"), s))?;
        Ok(start.elapsed())
    }

    /// Create, stage and publish.
    pub(super) async fn mounted(&self, name: String) -> Result<Vol, String> {
        let (mut v, _) = self.create(name).await?;
        let res = async {
            self.stage(&mut v).await?;
            self.publish(&mut v).await
        }
        .await;
        match res {
            Ok(_) => Ok(v),
            Err(e) => {
                self.undo(v).await;
                Err(e)
            }
        }
    }

    /// Unpublish, unstage and delete, as far as `v` got.
    pub(super) async fn remove(&self, mut v: Vol) -> Result<(), String> {
        if v.published {
            self.unpublish(&mut v).await?;
        }
        self.unstage(&mut v).await?;
        self.delete(&v.id).await?;
        Ok(())
    }

    /// [`Ctx::remove`] after a failure: problems are printed, not returned.
    pub(super) async fn undo(&self, v: Vol) {
        let id = v.id.clone();
        if let Err(e) = self.remove(v).await {
            eprintln!("localvol bench: cleanup of {id}: {e}");
        }
    }
}

/// Runs `f(0..n)` on `c` tasks that take indexes from one counter; the first
/// error stops new work (running calls finish) and is returned with what the
/// others produced. Results come back in index order.
pub(super) async fn parallel<T, F, Fut>(n: usize, c: u64, f: F) -> (Vec<T>, Option<String>)
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T, String>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let out: Arc<Mutex<Vec<(usize, T)>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..c.min(n as u64).max(1) {
        let (next, stop, out, f) = (next.clone(), stop.clone(), out.clone(), f.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                match f(i).await {
                    Ok(t) => out.lock().expect("results").push((i, t)),
                    Err(e) => {
                        stop.store(true, Ordering::SeqCst);
                        return Some(e);
                    }
                }
            }
            None
        }));
    }
    let mut err = None;
    for t in tasks {
        match t.await {
            Ok(Some(e)) => err = err.or(Some(e)),
            Ok(None) => {}
            Err(e) => err = err.or(Some(format!("worker failed: {e}"))),
        }
    }
    let mut results = std::mem::take(&mut *out.lock().expect("results"));
    results.sort_by_key(|(i, _)| *i);
    (results.into_iter().map(|(_, t)| t).collect(), err)
}

/// Removes `vols` on `c` tasks; the first problem is returned after all were tried.
pub(super) async fn remove_all(ctx: &Arc<Ctx>, vols: Vec<Vol>, c: u64) -> Result<(), String> {
    let vols = Arc::new(vols);
    let ctx2 = ctx.clone();
    let v2 = vols.clone();
    let (_, err) = parallel(vols.len(), c, move |i| {
        let (ctx, vols) = (ctx2.clone(), v2.clone());
        async move { ctx.remove(vols[i].clone()).await }
    })
    .await;
    err.map_or(Ok(()), Err)
}

/// Publishes `vols.len()..n` more volumes named `<prefix>-f<i>` on `c` tasks.
pub(super) async fn fill(
    ctx: &Arc<Ctx>,
    prefix: &str,
    vols: &mut Vec<Vol>,
    n: usize,
    c: u64,
) -> Result<(), String> {
    let from = vols.len();
    if n <= from {
        return Ok(());
    }
    let (ctx2, prefix) = (ctx.clone(), prefix.to_owned());
    let (made, err) = parallel(n - from, c, move |i| {
        let (ctx, name) = (ctx2.clone(), format!("{prefix}-f{}", from + i));
        async move { ctx.mounted(name).await }
    })
    .await;
    vols.extend(made);
    err.map_or(Ok(()), Err)
}
