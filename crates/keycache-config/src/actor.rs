//! Who a process is, for the audit trail ([`keycache::audit::Actor`]): the
//! OS user it runs as, the user behind `sudo`, and the master it writes
//! for, as the CLI and the Salt driver both record them.

use keycache::audit::Actor;

use crate::MasterConfig;

/// The name of the effective user of this process, or `uid N` when the
/// user database has no entry for it.
pub fn user_name() -> String {
    let uid = uzers::get_effective_uid();
    uzers::get_user_by_uid(uid)
        .and_then(|u| u.name().to_str().map(str::to_owned))
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// The master's id as Salt gives it: the config's `id`, else the host's
/// name with `_master` appended (Salt's `apply_master_config`; Salt asks
/// for the fully qualified name first, which a host without DNS does not
/// have either).
pub fn master_id(cfg: &MasterConfig) -> String {
    match cfg.id.as_ref() {
        Some(id) if !id.value.is_empty() => id.value.clone(),
        _ => format!("{}_master", host_name()),
    }
}

/// The host's name (`uname -n`).
pub fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// The actor of this process: `program`, its user, `sudo_user` (the value
/// of `SUDO_USER`, which the caller reads: `sudo` sets it), `master` and
/// the operator's `reason`.
pub fn actor(
    program: &str,
    sudo_user: Option<String>,
    master: Option<String>,
    reason: Option<String>,
) -> Actor {
    Actor {
        user: Some(user_name()),
        sudo_user: sudo_user.filter(|s| !s.is_empty()),
        program: program.to_owned(),
        master,
        reason: reason.filter(|s| !s.is_empty()),
        action: None,
    }
}
