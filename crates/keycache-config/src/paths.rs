//! Python's and Salt's path functions, as Salt applies them to `pki_dir`.

/// `os.path.expanduser` for `~` and `~/...` (`~user` is left as is).
pub fn expanduser(p: &str) -> String {
    if p == "~" || p.starts_with("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            let home = home.to_string_lossy().trim_end_matches('/').to_string();
            let home = if home.is_empty() { "/".into() } else { home };
            return format!("{home}{}", &p[1..]);
        }
    }
    p.to_string()
}

/// `posixpath.normpath`.
pub fn normpath(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let initial = if path.starts_with("//") && !path.starts_with("///") {
        2
    } else {
        usize::from(path.starts_with('/'))
    };
    let mut new: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        if comp.is_empty() || comp == "." {
            continue;
        }
        if comp != ".." || (initial == 0 && new.is_empty()) || new.last() == Some(&"..") {
            new.push(comp);
        } else if !new.is_empty() {
            new.pop();
        }
    }
    let out = format!("{}{}", "/".repeat(initial), new.join("/"));
    if out.is_empty() {
        ".".into()
    } else {
        out
    }
}

/// `posixpath.abspath`.
pub fn abspath(p: &str) -> String {
    if p.starts_with('/') {
        normpath(p)
    } else {
        let cwd = std::env::current_dir()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".into());
        normpath(&format!("{cwd}/{p}"))
    }
}

/// `salt.utils.path.join(root, path)` on POSIX.
pub fn salt_path_join(root: &str, path: &str) -> String {
    let root = normpath(root);
    let p = normpath(path);
    let stripped = p.trim_start_matches('/');
    let joined = if root.ends_with('/') || root.is_empty() {
        format!("{root}{stripped}")
    } else {
        format!("{root}/{stripped}")
    };
    normpath(&joined)
}

/// Salt's `prepend_root_dir` for one path option, `root_dir` already
/// `abspath`ed; `salt.syspaths.ROOT_DIR` is `/`, so its stripped form is
/// empty and every absolute path "starts with" it.
pub fn prepend_root_dir(root_dir: &str, path: &str) -> String {
    let def_root = "";
    let tmp_def = (path == def_root || path.starts_with(&format!("{def_root}/")))
        .then(|| &path[def_root.len()..])
        .filter(|s| !s.is_empty());
    let tmp_root = (!root_dir.is_empty()
        && (path == root_dir || path.starts_with(&format!("{root_dir}/"))))
    .then(|| &path[root_dir.len()..])
    .filter(|s| !s.is_empty());
    let p = match (tmp_def, tmp_root) {
        (Some(d), None) => d,
        (None, Some(r)) => r,
        // def_root ("") is in every root_dir: the root_dir-relative part.
        (Some(_), Some(r)) => r,
        (None, None) if path.starts_with('/') => return path.to_string(),
        (None, None) => path,
    };
    salt_path_join(root_dir, p)
}
