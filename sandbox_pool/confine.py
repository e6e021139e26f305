"""The last locks on a sandboxed child, set just before it runs untrusted code.

Standard library only (ctypes for prctl, capset and the seccomp filter), and no import of the
project: the package imports it as `sandbox_pool.confine`, the sandbox's own scripts (the
supervisor, and the executor image, which holds the .py files flat in /sandbox/) as `confine`.
The caller is a forked, single-threaded child, so nothing here needs to reach other threads.

Two calls, in this order around the uid change:

    drop_bounding_set()        # still root
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    lock_down()                # as the sandbox user, then exec or run the program

What each layer stops:

- `drop_bounding_set` empties the capability bounding set and the ambient set. The uid change
  already clears the permitted and effective sets; an empty bounding set means no later exec
  (a set-uid-root or file-capability binary) can hand a capability back, and an empty ambient
  set means none is carried across exec either. It needs CAP_SETPCAP, so it runs before setuid.
- `lock_down`:
  * clears the inheritable set, the last capability set the uid change leaves as it was;
  * sets no_new_privs: exec can no longer raise privileges (set-uid bits and file capabilities
    are ignored), and the kernel requires it before an unprivileged process may add a filter;
  * installs a seccomp filter (on x86_64 only: see SYSCALL_FILTER) that
      - kills the process for a system call made through another ABI (int 0x80, i386), whose
        numbers differ and would slip past every check below;
      - refuses (EPERM) x32 system calls (number | 0x40000000), another way around the numbers;
      - answers ENOSYS to clone3, whose flags sit in memory a filter cannot read, so glibc falls
        back to clone (as Docker's default profile does);
      - refuses (EPERM) clone with a namespace flag: new namespaces, a user namespace above all,
        give back inside them the capabilities the steps above took away, and widen the
        kernel's attack surface (mounts, netfilter, ...);
      - refuses (EPERM) the system calls in DENIED: namespaces and mounts, tracing and reading
        other processes, kernel modules and kexec, BPF, keyrings, perf, userfaultfd, io_uring,
        clocks, raw I/O ports, file handles, and obsolete calls. Several of them are refused to
        an unprivileged user anyway; the filter refuses them before any of the kernel's code
        behind them runs, which is where kernel bugs are found.
    Everything else is allowed: fork, threads, exec, files, sockets, mmap, signals.
    The filter and no_new_privs pass to every child and through exec, and cannot be undone.
"""
import ctypes
import os
import platform

# Install the seccomp filter only where DENIED's numbers and the filter's arch check are right.
# Elsewhere lock_down still clears the inheritable set and sets no_new_privs.
SYSCALL_FILTER = platform.machine() == "x86_64"

# x86_64 system call numbers (asm/unistd_64.h) of the calls the filter refuses with EPERM.
DENIED = {
    # namespaces, mounts and the root directory
    "unshare": 272,
    "setns": 308,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "move_mount": 429,
    "open_tree": 428,
    "mount_setattr": 442,
    # tracing, reading or comparing other processes
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "pidfd_getfd": 438,
    # kernel subsystems with a history of privilege-escalation bugs
    "bpf": 321,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "fanotify_init": 300,
    # kernel modules, kexec and the machine as a whole
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "quotactl": 179,
    "quotactl_fd": 443,
    "syslog": 103,
    "vhangup": 153,
    # clocks
    "settimeofday": 164,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "adjtimex": 159,
    # raw I/O ports
    "iopl": 172,
    "ioperm": 173,
    # file handles: open_by_handle_at reaches files outside the mounts a process can see
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    # obsolete
    "lookup_dcookie": 212,
    "uselib": 134,
    "nfsservctl": 180,
    "create_module": 174,
    "get_kernel_syms": 177,
    "query_module": 178,
    "_sysctl": 156,
}
CLONE = 56
CLONE3 = 435

# The namespace flags of clone's first argument (linux/sched.h). All sit in its low 32 bits,
# the word the filter reads. CLONE_NEWTIME shares its bit with clone's exit-signal byte, where
# no real signal (1..64) sets it, so refusing it costs nothing.
CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS
    | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
X32_SYSCALL_BIT = 0x40000000

# prctl options (linux/prctl.h)
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# seccomp return values (linux/seccomp.h); an errno goes in the low 16 bits of SECCOMP_RET_ERRNO.
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E  # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE

# Classic BPF opcodes (linux/filter.h) and the offsets of struct seccomp_data's fields:
# int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian: low word first).
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
BPF_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
NR_OFFSET = 0
ARCH_OFFSET = 4
ARG0_LOW_OFFSET = 16


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)  # our own handle: the argtypes below stay ours
# prctl is variadic and reads unsigned longs: pass full 64-bit words, not ctypes' default ints.
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.prctl.restype = ctypes.c_int
_libc.capset.argtypes = [ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData)]
_libc.capset.restype = ctypes.c_int


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    """prctl; 0 on success, else the errno (the caller decides which ones matter)."""
    if _libc.prctl(option, arg2, arg3, 0, 0) == 0:
        return 0
    return ctypes.get_errno() or 1


def _fail(err: int, what: str) -> OSError:
    return OSError(err, f"{what}: {os.strerror(err)}")


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # unknown: try them all; the first EINVAL ends the loop


def drop_bounding_set() -> None:
    """Empty the capability bounding set and the ambient set. Call as root, before setuid. The
    sets are inherited, and dropping them leaves the caller's own (permitted, effective)
    capabilities alone, so a root process that execs nothing privileged may drop them once for
    every child it will fork: the fork server and the container's executor do, at start."""
    for cap in range(_last_cap() + 1):
        err = _prctl(PR_CAPBSET_DROP, cap)
        if err == 22:  # EINVAL: above the kernel's last capability
            break
        if err:
            raise _fail(err, f"prctl(PR_CAPBSET_DROP, {cap})")
    err = _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if err and err != 22:  # EINVAL: a kernel without ambient capabilities (before 4.3)
        raise _fail(err, "prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)")


def filter_program() -> list[tuple[int, int, int, int]]:
    """The seccomp filter as (code, jt, jf, k) instructions. Every jump is a short forward one
    (at most 4), far from classic BPF's 255 limit however long DENIED grows."""

    def ret(value):
        return (BPF_RET_K, 0, 0, value)

    def errno(err):
        return ret(SECCOMP_RET_ERRNO | err)

    eperm = errno(1)
    program = [
        (BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
        (BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ret(SECCOMP_RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, NR_OFFSET),
        (BPF_JSET_K, 0, 1, X32_SYSCALL_BIT),
        eperm,
        (BPF_JEQ_K, 0, 1, CLONE3),
        errno(38),  # ENOSYS
        # clone: allowed unless a namespace flag is set. The accumulator then holds the flags,
        # not the number, so this block ends in a return either way.
        (BPF_JEQ_K, 0, 4, CLONE),
        (BPF_LD_W_ABS, 0, 0, ARG0_LOW_OFFSET),
        (BPF_JSET_K, 0, 1, NAMESPACE_FLAGS),
        eperm,
        ret(SECCOMP_RET_ALLOW),
    ]
    for number in DENIED.values():
        program += [(BPF_JEQ_K, 0, 1, number), eperm]
    program.append(ret(SECCOMP_RET_ALLOW))
    return program


def _compiled_filter():
    program = filter_program()
    instructions = (_SockFilter * len(program))(*(_SockFilter(*i) for i in program))
    return instructions, _SockFprog(len(program), ctypes.cast(instructions, ctypes.POINTER(_SockFilter)))


# Built once, when the module is imported (by the fork server or the container's executor, before
# they fork): a sandboxed child only hands it to the kernel. Work done in a fork of a large Python
# process costs more than it seems, as each object it touches copies a page.
_FILTER = _compiled_filter()


def _install_filter() -> None:
    err = _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(_FILTER[1]))
    if err:
        raise _fail(err, "prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)")


def lock_down() -> None:
    """Clear the inheritable set, set no_new_privs, and (on x86_64) install the seccomp filter.
    Call after the uid change, last thing before the untrusted code runs."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # version 3: two 32-bit words per set, all zero
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise _fail(ctypes.get_errno(), "capset")
    err = _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if err:
        raise _fail(err, "prctl(PR_SET_NO_NEW_PRIVS)")
    if SYSCALL_FILTER:
        _install_filter()
