//! Every system call of the tests that Rust's standard library does not
//! wrap, behind safe functions: the one place in the tests (and the test
//! kit) with `unsafe` code. Each block says why it is sound.
//!
//! - identity: [`euid`], [`is_root`];
//! - special files: [`mkfifo`], [`mknod_char`];
//! - children: [`umask_in_child`], [`trace_me_in_child`], [`kill`],
//!   [`waitpid`], and the ptrace requests the tracer needs
//!   ([`ptrace_set_options`], [`ptrace_syscall`], [`ptrace_get_regs`]);
//! - benchmarks: [`pin_to_cpu`], [`evict_from_page_cache`];
//! - SIGBUS: [`report_sigbus`] installs a handler that prints the context
//!   last set with [`set_sigbus_context`] and exits.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicPtr, Ordering};

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    euid() == 0
}

/// Makes a FIFO at `path` with `mode` (before the umask).
pub fn mkfifo(path: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    check(unsafe { libc::mkfifo(c.as_ptr(), mode as libc::mode_t) })
}

/// Makes a character device node `major:minor` at `path` (needs root).
pub fn mknod_char(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    let c = cstr(path)?;
    let dev = libc::makedev(major, minor);
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call;
    // the mode and device number are plain integers.
    check(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | mode as libc::mode_t, dev) })
}

/// Makes `cmd`'s child set its umask to `mask` before it executes.
pub fn umask_in_child(cmd: &mut Command, mask: u32) -> &mut Command {
    // SAFETY: the hook runs in the forked child before exec and only calls
    // umask(2), which is async-signal-safe, allocates nothing and takes no
    // lock.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(mask as libc::mode_t);
            Ok(())
        })
    }
}

/// Makes `cmd`'s child ask to be traced by its parent (PTRACE_TRACEME)
/// before it executes: it then stops at its exec with SIGTRAP.
#[cfg(target_os = "linux")]
pub fn trace_me_in_child(cmd: &mut Command) -> &mut Command {
    // SAFETY: the hook runs in the forked child before exec and only calls
    // ptrace(PTRACE_TRACEME) with null pointers, which is async-signal-safe
    // and touches no memory of ours; on failure it builds an io::Error from
    // errno, which does not allocate.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(
                libc::PTRACE_TRACEME,
                0,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            ) == -1
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Sends `signal` to process `pid`.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    check(unsafe { libc::kill(pid, signal) })
}

/// waitpid(2): waits for `pid` (-1: any child) with `flags`; returns the
/// pid that changed state and its raw wait status. Retries on EINTR.
pub fn waitpid(pid: i32, flags: i32) -> io::Result<(i32, i32)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a live, writable c_int for the whole call.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r >= 0 {
            return Ok((r, status));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// A ptrace request that takes integer arguments only.
#[cfg(target_os = "linux")]
fn ptrace_int(req: libc::c_uint, pid: i32, addr: usize, data: usize) -> io::Result<()> {
    // SAFETY: the requests passed here (SETOPTIONS, SYSCALL) read `addr`
    // and `data` as integers, never as pointers into our memory, and act on
    // a tracee of ours.
    let r = unsafe {
        libc::ptrace(
            req,
            pid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// PTRACE_SETOPTIONS on a stopped tracee.
#[cfg(target_os = "linux")]
pub fn ptrace_set_options(pid: i32, options: i32) -> io::Result<()> {
    ptrace_int(libc::PTRACE_SETOPTIONS, pid, 0, options as usize)
}

/// PTRACE_SYSCALL: resumes a stopped tracee until its next system call
/// entry or exit, delivering `signal` (0: none).
#[cfg(target_os = "linux")]
pub fn ptrace_syscall(pid: i32, signal: i32) -> io::Result<()> {
    ptrace_int(libc::PTRACE_SYSCALL, pid, 0, signal as usize)
}

/// PTRACE_GETREGS: the registers of a stopped tracee.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn ptrace_get_regs(pid: i32) -> io::Result<libc::user_regs_struct> {
    let mut regs = std::mem::MaybeUninit::<libc::user_regs_struct>::zeroed();
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct at `data`, which
    // points to a live, writable, correctly sized and aligned one.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGS,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            regs.as_mut_ptr().cast::<libc::c_void>(),
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: user_regs_struct is plain integers, for which all-zero bytes
    // (and whatever the kernel wrote) are a valid value.
    Ok(unsafe { regs.assume_init() })
}

/// Pins the calling thread to CPU `cpu` (modulo the CPUs available), for
/// steadier timings; errors are ignored (pinning is only a hint here).
#[cfg(target_os = "linux")]
pub fn pin_to_cpu(cpu: usize) {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // SAFETY: cpu_set_t is a plain bit array for which all-zero bytes are
    // the empty set; CPU_SET writes one bit inside it (cpu % n is below
    // CPU_SETSIZE on any machine with fewer CPUs than that); the set is
    // live and correctly sized for the whole sched_setaffinity call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % n, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Writes `file`'s dirty pages out and drops its pages from the page cache
/// (fdatasync, then posix_fadvise DONTNEED), for cold-cache timings.
#[cfg(target_os = "linux")]
pub fn evict_from_page_cache(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `file`, which outlives
    // both calls; neither touches our memory.
    check(unsafe { libc::fdatasync(fd) })?;
    // SAFETY: as above.
    match unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// The context the SIGBUS handler prints: a leaked NUL-terminated string.
static SIGBUS_CONTEXT: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigbus(_: libc::c_int) {
    let msg = b"\nSIGBUS in: ";
    let p = SIGBUS_CONTEXT.load(Ordering::SeqCst);
    // SAFETY: write(2), strlen and _exit(2) are async-signal-safe; `msg` is
    // a live buffer; `p` is null or a NUL-terminated string leaked by
    // set_sigbus_context and never freed.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        if !p.is_null() {
            libc::write(2, p.cast(), libc::strlen(p));
        }
        libc::write(2, b"\n".as_ptr().cast(), 1);
        libc::_exit(99);
    }
}

/// Installs a SIGBUS handler that prints the last context set by
/// [`set_sigbus_context`] to stderr and exits with status 99 (instead of
/// dying without a word).
pub fn report_sigbus() {
    // SAFETY: the handler only calls async-signal-safe functions; the
    // sigaction struct is zeroed (a valid value: no flags, empty mask) and
    // outlives the call; the old action is not asked for (null).
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as usize;
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut())
    };
    assert_eq!(r, 0, "sigaction(SIGBUS): {}", io::Error::last_os_error());
}

/// Sets what the SIGBUS handler names (NUL bytes become spaces). The string
/// is leaked on purpose: the handler may read it at any time.
pub fn set_sigbus_context(what: &str) {
    let c = CString::new(what.replace('\0', " ")).expect("no NUL left");
    SIGBUS_CONTEXT.store(c.into_raw(), Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    #[test]
    fn euid_is_the_owner_of_what_we_create_and_mkfifo_makes_a_fifo() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("fifo");
        super::mkfifo(&f, 0o600).unwrap();
        let m = std::fs::symlink_metadata(&f).unwrap();
        assert!(m.file_type().is_fifo());
        assert_eq!(m.uid(), super::euid());
        assert_eq!(super::is_root(), super::euid() == 0);
        assert!(super::mkfifo(&f, 0o600).is_err(), "exists already");
    }

    #[test]
    fn pinning_and_eviction_work() {
        super::pin_to_cpu(0);
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, vec![7u8; 10_000]).unwrap();
        super::evict_from_page_cache(&std::fs::File::open(&p).unwrap()).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), vec![7u8; 10_000]);
    }

    #[test]
    fn kill_and_waitpid_reap_a_child() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // Reaped by waitpid below, not by `Child`.
        drop(child);
        super::kill(pid, libc::SIGKILL).unwrap();
        let (got, status) = super::waitpid(pid, 0).unwrap();
        assert_eq!(got, pid);
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);
    }
}
