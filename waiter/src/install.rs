//! `install DEST`: copies this executable to DEST, mode 0555, atomically (DEST.tmp-<pid>,
//! fsync, rename), so that an app container never sees a half-written hook.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const SELF: &str = "/proc/self/exe";

pub fn install(dest: &Path) -> Result<(), String> {
    let mut tmp_name = dest.as_os_str().to_owned();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let result = copy_to(&tmp).and_then(|()| std::fs::rename(&tmp, dest).map_err(|e| format!("rename {} to {}: {e}", tmp.display(), dest.display())));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // the rename itself, durably: best effort (an emptyDir lives as long as the pod anyway)
    if let Some(parent) = dest.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
        && let Ok(dir) = File::open(parent)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

fn copy_to(tmp: &Path) -> Result<(), String> {
    let mut src = File::open(SELF).map_err(|e| format!("open {SELF}: {e}"))?;
    // a leftover of an earlier attempt of a process with the same pid
    let _ = std::fs::remove_file(tmp);
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(libc::O_CLOEXEC)
        .open(tmp)
        .map_err(|e| format!("create {}: {e}", tmp.display()))?;
    let w = |e: io::Error| format!("write {}: {e}", tmp.display());
    io::copy(&mut src, &mut out).map_err(w)?;
    // explicitly, whatever the umask: readable and executable by any UID, writable by none
    out.set_permissions(Permissions::from_mode(0o555)).map_err(w)?;
    out.sync_all().map_err(w)?;
    Ok(())
}
