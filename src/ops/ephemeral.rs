//! CSI ephemeral inline volumes: a dir volume named by kubelet's volume
//! handle, made at NodePublishVolume and removed at NodeUnpublishVolume.

use std::sync::Arc;

use super::checks::mount_options;
use super::{lock, unfit, Capability, PoolParams, Result};
use crate::driver::{Driver, Kind};
use crate::error::blocking;
use crate::fsutil::RequestPath;
use crate::ids::{VolumeId, VolumeName};
use crate::nodeops;
use crate::pool::{
    AccessType, Backend, CapacityRange, CreateRequest, Pool, PoolError, Source, Volume,
    EPHEMERAL_KEY, EPHEMERAL_TARGET_KEY,
};

/// A decoded NodePublishVolumeRequest of an ephemeral inline volume.
#[derive(Debug)]
pub struct NewEphemeral {
    /// kubelet's volume handle (never in the form of our ids).
    pub name: VolumeName,
    pub target: RequestPath,
    /// Read-write, mount access.
    pub cap: Capability,
    /// The volume attributes: the StorageClass-like parameters (kubelet's
    /// pod information among them) and `size`.
    pub params: PoolParams,
    pub size: u64,
}

/// NodePublishVolume of an ephemeral inline volume: creates a dir volume
/// named by kubelet's volume handle (pool and size from the volume
/// attributes; quota-enforced where the pool enforces quotas), recording
/// the target, and binds it there. A repeat finds the volume and the bind
/// already there.
pub async fn publish_ephemeral(d: &Driver, req: NewEphemeral) -> Result<()> {
    let NewEphemeral {
        name,
        target,
        cap,
        params,
        size,
    } = req;
    let _guard = lock(d, Kind::Volume, "volume_id", name.as_str())?;
    let pool_name = params
        .pool
        .clone()
        .unwrap_or_else(|| d.pools.default_pool().clone());
    let pool = d.pools.require(&pool_name)?.clone();
    if pool.backend() != Backend::Dir {
        return unfit(format!(
            "ephemeral volumes come from dir pools; pool {pool_name} is {}",
            pool.backend()
        ));
    }
    let src_flags = mount_options(&cap, &Source::Directory(Default::default()))?.flags;
    let target = blocking(move || Ok::<_, super::OpError>(target.resolve()?)).await?;
    let mut parameters = params.kept;
    parameters.insert(EPHEMERAL_KEY.to_owned(), "true".to_owned());
    parameters.insert(
        EPHEMERAL_TARGET_KEY.to_owned(),
        target.to_string_lossy().into_owned(),
    );
    let vol = pool
        .create(&CreateRequest {
            source: None,
            id: VolumeId::new(pool_name, &name),
            name,
            range: CapacityRange {
                required: size,
                limit: 0,
            },
            access_type: AccessType::Mount,
            inode_limit: params.inode_limit,
            parameters,
            encryption: None,
            io_limits: Default::default(),
        })
        .await?;
    let Source::Directory(dir) = pool.source(&vol)? else {
        return Err(PoolError::Inconsistent(format!(
            "dir pool {} named a device for {}",
            pool.name(),
            vol.id
        ))
        .into());
    };
    blocking(move || Ok::<_, super::OpError>(nodeops::publish_dir(&dir, &target, src_flags)?)).await
}

/// NodeUnpublishVolume of an ephemeral inline volume: unmounted first, then
/// removed (its pool refuses while it is still mounted anywhere). The caller
/// holds the volume's lock.
pub(super) async fn unpublish(
    (id, pool, vol): (VolumeId, Arc<dyn Pool>, Volume),
    target: RequestPath,
) -> Result<()> {
    let src = pool.source(&vol)?;
    blocking(move || -> Result<_> {
        Ok(nodeops::unpublish(
            &target.resolve()?,
            Some((&src, AccessType::Mount)),
        )?)
    })
    .await?;
    pool.delete(&id).await?;
    tracing::info!(volume = %id, name = %vol.name, "ephemeral volume removed");
    Ok(())
}
