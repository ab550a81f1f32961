//! A minimal ptrace tracer (x86_64 Linux): stops a child (and its threads)
//! at the entry and exit of every system call and hands each stop to a
//! callback, which can kill the child there. Safe code over
//! [`crate::sys`].

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sys;

/// One system call stop of the tracee.
#[derive(Debug, Clone, Copy)]
pub struct Stop {
    /// The traced process (the thread group leader).
    pub pid: i32,
    /// Entry (true) or exit (false) of the call.
    pub entry: bool,
    /// The system call number.
    pub nr: i64,
    /// Its six arguments.
    pub args: [u64; 6],
    /// Its return value (at the exit).
    pub ret: i64,
}

/// What the callback wants done at a stop.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Let the tracee go on.
    Go,
    /// SIGKILL the tracee here.
    Kill,
}

/// How a traced run ended.
#[derive(Debug)]
pub struct End {
    /// The callback killed it.
    pub killed: bool,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The system call entries it made.
    pub syscalls: u64,
}

/// Runs `cmd` under the tracer, calling `f` at every syscall stop; kills it
/// and panics after `timeout`.
pub fn run(mut cmd: Command, timeout: Duration, mut f: impl FnMut(&Stop) -> Action) -> End {
    sys::trace_me_in_child(&mut cmd);
    let child = cmd.spawn().expect("spawn a traced child");
    let pid = child.id() as i32;
    // Reaped by the waitpid loop below, not by `Child`.
    drop(child);
    let (r, status) = sys::waitpid(pid, libc::__WALL).expect("waitpid");
    assert_eq!(r, pid, "waitpid");
    assert!(libc::WIFSTOPPED(status), "stopped at exec");
    let opts = libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_EXITKILL;
    sys::ptrace_set_options(pid, opts).expect("PTRACE_SETOPTIONS");
    // Watchdog.
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        while !d2.load(Ordering::Relaxed) {
            if start.elapsed() > timeout {
                let _ = sys::kill(pid, libc::SIGKILL);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    });
    let _ = sys::ptrace_syscall(pid, 0);
    let mut in_sys: HashMap<i32, (i64, [u64; 6])> = HashMap::new();
    let mut known: HashSet<i32> = [pid].into_iter().collect();
    let mut killed = false;
    let mut exit_code = None;
    let mut syscalls = 0;
    // __WNOTHREAD keeps this thread from reaping children of the other test
    // threads.
    while let Ok((tid, st)) = sys::waitpid(-1, libc::__WALL | libc::__WNOTHREAD) {
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            if tid == pid && libc::WIFEXITED(st) {
                exit_code = Some(libc::WEXITSTATUS(st));
            }
            in_sys.remove(&tid);
            continue;
        }
        if !libc::WIFSTOPPED(st) {
            continue;
        }
        let sig = libc::WSTOPSIG(st);
        let mut inject = 0;
        if sig == libc::SIGTRAP | 0x80 {
            let Ok(regs) = sys::ptrace_get_regs(tid) else {
                continue;
            };
            let stop = match in_sys.remove(&tid) {
                Some((nr, args)) => Stop {
                    pid,
                    entry: false,
                    nr,
                    args,
                    ret: regs.rax as i64,
                },
                None => {
                    let nr = regs.orig_rax as i64;
                    let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
                    in_sys.insert(tid, (nr, args));
                    syscalls += 1;
                    Stop {
                        pid,
                        entry: true,
                        nr,
                        args,
                        ret: 0,
                    }
                }
            };
            if !killed && f(&stop) == Action::Kill {
                let _ = sys::kill(pid, libc::SIGKILL);
                killed = true;
            }
        } else if sig == libc::SIGTRAP && (st >> 16) != 0 {
            // A clone event; the new thread is traced already.
        } else if sig == libc::SIGSTOP && known.insert(tid) {
            // The first stop of a new thread.
        } else {
            inject = sig;
        }
        let _ = sys::ptrace_syscall(tid, inject);
    }
    done.store(true, Ordering::Relaxed);
    let timed_out = watchdog.join().unwrap();
    assert!(!timed_out, "traced child timed out");
    End {
        killed,
        exit_code,
        syscalls,
    }
}

/// Reads `len` bytes of the tracee's memory at `addr` (fewer if not mapped).
pub fn read_mem(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/mem")) {
        let n = f.read_at(&mut buf, addr).unwrap_or(0);
        buf.truncate(n);
    }
    buf
}

/// The name of an x86_64 system call number, for tallies.
pub fn syscall_name(nr: i64) -> String {
    let names: &[(i64, &str)] = &[
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        (libc::SYS_pwrite64, "pwrite"),
        (libc::SYS_pread64, "pread"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_close, "close"),
        (libc::SYS_fsync, "fsync"),
        (libc::SYS_fdatasync, "fdatasync"),
        (libc::SYS_msync, "msync"),
        (libc::SYS_rename, "rename"),
        (libc::SYS_renameat, "renameat"),
        (libc::SYS_renameat2, "renameat2"),
        (libc::SYS_unlink, "unlink"),
        (libc::SYS_unlinkat, "unlinkat"),
        (libc::SYS_flock, "flock"),
        (libc::SYS_mmap, "mmap"),
        (libc::SYS_munmap, "munmap"),
        (libc::SYS_statx, "statx"),
        (libc::SYS_newfstatat, "newfstatat"),
        (libc::SYS_fstat, "fstat"),
        (libc::SYS_ftruncate, "ftruncate"),
        (libc::SYS_fallocate, "fallocate"),
        (libc::SYS_getdents64, "getdents64"),
        (libc::SYS_fchmod, "fchmod"),
        (libc::SYS_fchown, "fchown"),
        (libc::SYS_madvise, "madvise"),
        (libc::SYS_clock_gettime, "clock_gettime"),
        (libc::SYS_futex, "futex"),
        (libc::SYS_sched_yield, "sched_yield"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, s)| s.to_string())
        .unwrap_or_else(|| format!("#{nr}"))
}

/// Whether `nr` is one of the rename system calls.
pub fn is_rename(nr: i64) -> bool {
    [libc::SYS_rename, libc::SYS_renameat, libc::SYS_renameat2].contains(&nr)
}

/// Runs `cmd` (at most `timeout`) and kills it on entry to the `n`th of its
/// system calls that `counted` selects (by number).
pub fn kill_at(cmd: Command, timeout: Duration, n: u64, counted: impl Fn(i64) -> bool) -> End {
    let mut calls = 0;
    run(cmd, timeout, |s| {
        if s.entry && counted(s.nr) {
            calls += 1;
            if calls == n {
                return Action::Kill;
            }
        }
        Action::Go
    })
}

/// Runs `cmd` (at most 60 s) and kills it on entry to its `n`th rename
/// system call.
pub fn kill_at_rename(cmd: Command, n: u64) -> End {
    kill_at(cmd, Duration::from_secs(60), n, is_rename)
}
